-- Issuer-domain events are numbered 1, 2, 3 … as the service writes them: one written with
-- database access alone before or between the others (seq 0, a gap) sorted ahead of what
-- checkpoints had committed to, and every later checkpoint and witness run saw the committed
-- list "undone", for good: an alarm that no longer told a real undo from noise.
CREATE OR REPLACE FUNCTION domain_events_are_appended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.mac IS NULL OR NEW.seq IS DISTINCT FROM (SELECT COALESCE(MAX(seq), 0) + 1 FROM domain_events) THEN
            RAISE EXCEPTION 'an issuer-domain event is sealed by the service, and numbered after the last';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the issuer-domain holdings are append-only';
END;
$$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION domain_events_are_appended() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;
