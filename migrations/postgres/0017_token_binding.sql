-- The RFC 7638 thumbprint of the key an agent's newest token is bound to (DPoP, RFC 9449);
-- NULL while its newest token is a bearer token. Shown to the issuer only: verification
-- reads the binding from the signed token, never from here.
ALTER TABLE agents ADD COLUMN jkt TEXT;
