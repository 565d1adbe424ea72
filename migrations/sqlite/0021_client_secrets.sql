-- An agent's client secrets (RFC 6749 §2.3.1), for client_secret_basic and client_secret_post
-- at the token endpoint: each stored as its SHA-256 (a secret holds 256 random bits). The
-- newest has no expiry; the one it replaced stays valid 24 h more; older ones are deleted when
-- a new one is made. No foreign key to agents: nothing may stand in the way of a revocation's
-- guards on that table (its rows are never deleted).
CREATE TABLE client_secrets (
    agent_id    TEXT NOT NULL,
    secret_hash BLOB NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    PRIMARY KEY (agent_id, secret_hash)
);
