-- Every agent's key binding is sealed, an agent bound to no key too: a key taken out of an
-- agent's row with database access alone (which would make its next token a bearer token)
-- no longer passes for an agent that never had one. The agents bound to no key are marked
-- (a MAC of one byte) until an instance seals them (an agent with a key and no MAC was
-- written past the triggers: it stays unsealed, an alarm); every agent written from now on,
-- and every change of a binding, carries a fresh MAC of 32 bytes.
UPDATE agents SET key_mac = X'00' WHERE key_mac IS NULL AND jwk IS NULL AND jkt IS NULL;
-- The marked ones, which every start looks for: none, once sealed.
CREATE INDEX agents_unsealed ON agents (id) WHERE length(key_mac) = 1;

DROP TRIGGER agents_keys_written_sealed;
DROP TRIGGER agents_keys_stay_sealed;
CREATE TRIGGER agents_keys_written_sealed BEFORE INSERT ON agents
WHEN typeof(NEW.key_mac) <> 'blob' OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
  OR abs(NEW.key_sealed_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000
BEGIN
    SELECT RAISE(ABORT, 'an agent''s key binding is written sealed, and its seal fresh');
END;
CREATE TRIGGER agents_keys_stay_sealed BEFORE UPDATE OF jwk, jkt, key_mac, key_sealed_at ON agents
WHEN typeof(NEW.key_mac) <> 'blob' OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
  OR abs(NEW.key_sealed_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000
BEGIN
    SELECT RAISE(ABORT, 'an agent''s key binding is written sealed, and its seal fresh');
END;
