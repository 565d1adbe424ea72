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
ALTER TABLE agents ADD COLUMN key_mac BYTEA;
ALTER TABLE agents ADD COLUMN key_sealed_at BIGINT;
ALTER TABLE client_secrets ADD COLUMN mac BYTEA NOT NULL DEFAULT ''::bytea;
UPDATE agents SET key_mac = decode('00', 'hex') WHERE jwk IS NOT NULL OR jkt IS NOT NULL;
UPDATE client_secrets SET mac = decode('00', 'hex');

CREATE TRIGGER agents_keys_written_sealed BEFORE INSERT ON agents
    FOR EACH ROW WHEN ((NEW.jwk IS NOT NULL OR NEW.jkt IS NOT NULL)
                       AND (NEW.key_mac IS NULL OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
                            OR abs(NEW.key_sealed_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000))
    EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER agents_keys_stay_sealed BEFORE UPDATE OF jwk, jkt, key_mac, key_sealed_at ON agents
    FOR EACH ROW WHEN ((NEW.jwk IS NOT NULL OR NEW.jkt IS NOT NULL)
                       AND (NEW.key_mac IS NULL OR length(NEW.key_mac) <> 32 OR NEW.key_sealed_at IS NULL
                            OR abs(NEW.key_sealed_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000))
    EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER client_secrets_written_sealed BEFORE INSERT ON client_secrets
    FOR EACH ROW WHEN (length(NEW.mac) <> 32
                       OR abs(NEW.created_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000)
    EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER client_secrets_stay_sealed BEFORE UPDATE OF mac, created_at, agent_id, secret_hash ON client_secrets
    FOR EACH ROW WHEN (length(NEW.mac) <> 32 OR NEW.created_at IS DISTINCT FROM OLD.created_at
                       OR NEW.agent_id IS DISTINCT FROM OLD.agent_id
                       OR NEW.secret_hash IS DISTINCT FROM OLD.secret_hash)
    EXECUTE FUNCTION rows_written_sealed();
CREATE FUNCTION client_secrets_end_is_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a replaced client secret''s end never moves';
END;
$$;
CREATE TRIGGER client_secrets_end_is_kept BEFORE UPDATE OF expires_at ON client_secrets
    FOR EACH ROW WHEN (OLD.expires_at IS NOT NULL AND NEW.expires_at IS DISTINCT FROM OLD.expires_at)
    EXECUTE FUNCTION client_secrets_end_is_kept();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION client_secrets_end_is_kept() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;
