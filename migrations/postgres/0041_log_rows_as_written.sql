-- Log rows as the service writes them. A checkpoint row that did not decode (a root not of 32
-- bytes, a negative size) failed every read of its ledger's checkpoints: no checkpoint came
-- after it, the log's endpoints answered 500 and the witness could check nothing. One dated
-- ahead of now (a replayed note of the empty tree) held the checkpointer off its ledger until
-- then, with no alarm. An audit block before seq 1 sorted ahead of every record, listed by the
-- log and read by nothing that checks it. A minute ahead is left for the clocks of a fleet.
CREATE FUNCTION log_rows_as_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'audit_checkpoints' THEN
        IF NEW.tree_size < 0 OR length(NEW.root) <> 32 OR NEW.created_at < 0
           OR NEW.created_at > (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000 THEN
            RAISE EXCEPTION 'a checkpoint has a size, a 32-byte root and a time not ahead of now';
        END IF;
    ELSIF NEW.first_seq < 1 OR NEW.last_seq < NEW.first_seq THEN
        RAISE EXCEPTION 'an audit block holds records from seq 1 on';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER audit_checkpoints_as_written BEFORE INSERT ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION log_rows_as_written();
CREATE TRIGGER audit_blocks_from_seq_one BEFORE INSERT ON audit_blocks
    FOR EACH ROW EXECUTE FUNCTION log_rows_as_written();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION log_rows_as_written() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;
