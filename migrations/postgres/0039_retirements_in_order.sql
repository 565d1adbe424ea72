-- Retirements are committed to in the order of their times, and a key counts as retired from
-- its time on. A key recorded retired already, or a retirement dated before the last one, would
-- reorder what checkpoints committed to (every later one an alarm that no longer tells a real
-- undo from noise); one dated ahead of now would leave its key signing or validating until
-- then, and push every later retirement past it. The service retires a key at now (or just
-- after the last retirement); a minute ahead is left for the clocks of a fleet.
CREATE FUNCTION signing_keys_retired_in_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.retired_at IS NOT NULL THEN
            RAISE EXCEPTION 'a signing key is recorded unretired';
        END IF;
    ELSIF OLD.retired_at IS NULL AND NEW.retired_at IS NOT NULL
          AND (NEW.retired_at <= COALESCE((SELECT MAX(retired_at) FROM signing_keys), NEW.retired_at - 1)
               OR NEW.retired_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint + 60000) THEN
        RAISE EXCEPTION 'a retirement is dated after the last one, and not ahead of now';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER signing_keys_retired_in_order BEFORE INSERT OR UPDATE OF retired_at ON signing_keys
    FOR EACH ROW EXECUTE FUNCTION signing_keys_retired_in_order();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION signing_keys_retired_in_order() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;
