-- Agents as OAuth clients (private_key_jwt, RFC 7523): the public key an agent's newest
-- token is bound to, as its RFC 7638 members in canonical JSON (its thumbprint is `jkt`).
-- An agent authenticates at the token endpoint with a JWT signed by this key. NULL while
-- its newest token is a bearer token.
ALTER TABLE agents ADD COLUMN jwk TEXT;

-- Client assertions used, each until it expires: a replay is refused while it could
-- still pass. `key` is a hash of the client and the assertion's jti; rows past their
-- `expires_at` (Unix ms) are deleted as new ones come.
CREATE TABLE client_assertions (
    key TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
CREATE INDEX client_assertions_expiry ON client_assertions (expires_at);
