-- An agent's credentials are sealed by the key file: the key it is bound to (the key it
-- authenticates with as an OAuth client, and signs its requests with) carries the key file's
-- MAC of the agent, the key and when it was sealed; each client secret the MAC of the agent,
-- the secret's hash and when it was made. A key or a secret written with database access
-- alone authenticates nobody. Rows written before this are marked (a MAC of one byte) until
-- an instance seals them; every key and secret written from now on carries a MAC of 32
-- bytes (an agent bound to no key carries none: a mark there is harmless). Seals are
-- taken only within a minute of the database's clock, so an earlier key or a deleted secret,
-- copied back with its seal, is refused; a secret's agent and hash never change, and a
-- replaced secret's end never moves.
ALTER TABLE agents ADD COLUMN key_mac BLOB;
ALTER TABLE agents ADD COLUMN key_sealed_at INTEGER;
ALTER TABLE client_secrets ADD COLUMN mac BLOB NOT NULL DEFAULT X'';
UPDATE agents SET key_mac = X'00' WHERE jwk IS NOT NULL OR jkt IS NOT NULL;
UPDATE client_secrets SET mac = X'00';

CREATE TRIGGER agents_keys_written_sealed BEFORE INSERT ON agents
WHEN (NEW.jwk IS NOT NULL OR NEW.jkt IS NOT NULL)
  AND (typeof(NEW.key_mac) <> 'blob' OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
       OR abs(NEW.key_sealed_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000)
BEGIN
    SELECT RAISE(ABORT, 'an agent''s key is written sealed, and its seal fresh');
END;
CREATE TRIGGER agents_keys_stay_sealed BEFORE UPDATE OF jwk, jkt, key_mac, key_sealed_at ON agents
WHEN (NEW.jwk IS NOT NULL OR NEW.jkt IS NOT NULL)
  AND (typeof(NEW.key_mac) <> 'blob' OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
       OR abs(NEW.key_sealed_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000)
BEGIN
    SELECT RAISE(ABORT, 'an agent''s key is written sealed, and its seal fresh');
END;
CREATE TRIGGER client_secrets_written_sealed BEFORE INSERT ON client_secrets
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
  OR abs(NEW.created_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000
BEGIN
    SELECT RAISE(ABORT, 'a client secret is written sealed, and its seal fresh');
END;
CREATE TRIGGER client_secrets_stay_sealed BEFORE UPDATE OF mac, created_at, agent_id, secret_hash ON client_secrets
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32 OR NEW.created_at IS NOT OLD.created_at
  OR NEW.agent_id IS NOT OLD.agent_id OR NEW.secret_hash IS NOT OLD.secret_hash
BEGIN
    SELECT RAISE(ABORT, 'a client secret is written sealed, and its seal fresh');
END;
CREATE TRIGGER client_secrets_end_is_kept BEFORE UPDATE OF expires_at ON client_secrets
WHEN OLD.expires_at IS NOT NULL AND NEW.expires_at IS NOT OLD.expires_at
BEGIN
    SELECT RAISE(ABORT, 'a replaced client secret''s end never moves');
END;
