-- Signing-key rotation (src/engine/signing.rs). A rotated key's private half is stored sealed
-- under a key derived from the key file (AES-256-GCM); the key file's own key has none here.
-- activates_at: when it starts signing (NULL: at created_at); retired_at: retired by hand;
-- last_expires_at: the latest expiry of a token it signed (ms), so that a replaced key leaves
-- the key set once its last token has expired.
ALTER TABLE signing_keys ADD COLUMN private_key BLOB;
ALTER TABLE signing_keys ADD COLUMN activates_at INTEGER;
ALTER TABLE signing_keys ADD COLUMN retired_at INTEGER;
ALTER TABLE signing_keys ADD COLUMN last_expires_at INTEGER;
-- Tokens signed before this migration were all signed by the one key there was.
UPDATE signing_keys SET last_expires_at = (SELECT MAX(expires_at) FROM agents);
