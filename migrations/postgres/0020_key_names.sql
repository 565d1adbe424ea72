-- API keys get an id (so that a key its holder no longer has can still be disabled), an
-- optional name, and when they were last used (written at most once a minute). Keys made
-- before have an id taken from their hash: unique, and saying nothing of the key.
ALTER TABLE api_keys ADD COLUMN id TEXT, ADD COLUMN name TEXT, ADD COLUMN last_used_at BIGINT;
UPDATE api_keys SET id = 'key_' || substr(encode(key_hash, 'hex'), 1, 26);
ALTER TABLE api_keys ALTER COLUMN id SET NOT NULL;
CREATE UNIQUE INDEX api_keys_id ON api_keys (id);
