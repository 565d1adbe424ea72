-- API keys and organizations' plans are sealed by the key file: each row carries the key
-- file's MAC of what it grants (a key: its hash, organization, kind and mode; an organization:
-- its plan, its limits and when they were sealed). A key row or a plan written with database
-- access alone opens nothing. Rows written before this are marked (a MAC of one byte) until
-- an instance seals them; every row written from now on carries a MAC of 32 bytes. Seals
-- carry their time: the database takes one only within a minute of its clock, so an earlier
-- plan, copied back with its seal, is refused.
ALTER TABLE orgs ADD COLUMN mac BYTEA NOT NULL DEFAULT ''::bytea;
ALTER TABLE orgs ADD COLUMN sealed_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN mac BYTEA NOT NULL DEFAULT ''::bytea;
UPDATE orgs SET mac = decode('00', 'hex');
UPDATE api_keys SET mac = decode('00', 'hex');

CREATE FUNCTION rows_written_sealed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are written sealed, and seals that carry a time fresh', TG_TABLE_NAME;
END;
$$;
CREATE TRIGGER orgs_written_sealed BEFORE INSERT ON orgs
    FOR EACH ROW WHEN (length(NEW.mac) <> 32
                       OR abs(NEW.sealed_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000)
    EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER orgs_stay_sealed BEFORE UPDATE OF mac, sealed_at ON orgs
    FOR EACH ROW WHEN (length(NEW.mac) <> 32
                       OR abs(NEW.sealed_at - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint) > 60000)
    EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER api_keys_written_sealed BEFORE INSERT ON api_keys
    FOR EACH ROW WHEN (length(NEW.mac) <> 32) EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER api_keys_stay_sealed BEFORE UPDATE OF mac ON api_keys
    FOR EACH ROW WHEN (length(NEW.mac) <> 32) EXECUTE FUNCTION rows_written_sealed();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION rows_written_sealed() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;
