-- Every agent's key binding is sealed, an agent bound to no key too: a key taken out of an
-- agent's row with database access alone (which would make its next token a bearer token)
-- no longer passes for an agent that never had one. The agents bound to no key are marked
-- (a MAC of one byte) until an instance seals them (an agent with a key and no MAC was
-- written past the triggers: it stays unsealed, an alarm); every agent written from now on,
-- and every change of a binding, carries a fresh MAC of 32 bytes.
UPDATE agents SET key_mac = decode('00', 'hex') WHERE key_mac IS NULL AND jwk IS NULL AND jkt IS NULL;
-- The marked ones, which every start looks for: none, once sealed.
CREATE INDEX agents_unsealed ON agents (id) WHERE length(key_mac) = 1;

DROP TRIGGER agents_keys_written_sealed ON agents;
DROP TRIGGER agents_keys_stay_sealed ON agents;
CREATE TRIGGER agents_keys_written_sealed BEFORE INSERT ON agents
    FOR EACH ROW WHEN (NEW.key_mac IS NULL OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
                       OR abs(NEW.key_sealed_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000)
    EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER agents_keys_stay_sealed BEFORE UPDATE OF jwk, jkt, key_mac, key_sealed_at ON agents
    FOR EACH ROW WHEN (NEW.key_mac IS NULL OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
                       OR abs(NEW.key_sealed_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000)
    EXECUTE FUNCTION rows_written_sealed();
