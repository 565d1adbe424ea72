-- The public keys the fleet signs with. The first start on a database with none records the
-- key in its key file; every later start must hold the private half of a recorded key, so an
-- instance started with another key file, or none, refuses to start instead of making a key
-- of its own.
CREATE TABLE signing_keys (
    kid        TEXT PRIMARY KEY, -- RFC 7638 thumbprint
    public_key BYTEA NOT NULL,  -- Ed25519, 32 bytes
    created_at BIGINT NOT NULL
);
