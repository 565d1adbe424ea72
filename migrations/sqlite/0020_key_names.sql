-- API keys get an id (so that a key its holder no longer has can still be disabled), an
-- optional name, and when they were last used (written at most once a minute). Keys made
-- before have an id taken from their hash: unique, and saying nothing of the key.
ALTER TABLE api_keys ADD COLUMN id TEXT;
ALTER TABLE api_keys ADD COLUMN name TEXT;
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
UPDATE api_keys SET id = 'key_' || substr(lower(hex(key_hash)), 1, 26);
CREATE UNIQUE INDEX api_keys_id ON api_keys (id);
