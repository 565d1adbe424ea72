-- API keys and organizations' plans are sealed by the key file: each row carries the key
-- file's MAC of what it grants (a key: its hash, organization, kind and mode; an organization:
-- its plan and limits). A key row or a plan written with database access alone opens
-- nothing. Rows written before this hold an empty MAC until the first instance to start
-- seals them; every row written from now on carries one.
ALTER TABLE orgs ADD COLUMN mac BYTEA NOT NULL DEFAULT ''::bytea;
ALTER TABLE api_keys ADD COLUMN mac BYTEA NOT NULL DEFAULT ''::bytea;

CREATE FUNCTION rows_written_sealed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are written sealed', TG_TABLE_NAME;
END;
$$;
CREATE TRIGGER orgs_written_sealed BEFORE INSERT ON orgs
    FOR EACH ROW WHEN (length(NEW.mac) <> 32) EXECUTE FUNCTION rows_written_sealed();
CREATE TRIGGER orgs_stay_sealed BEFORE UPDATE OF mac ON orgs
    FOR EACH ROW WHEN (length(NEW.mac) <> 32) EXECUTE FUNCTION rows_written_sealed();
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
