-- Checkpoints commit to the ledger's revocations (by epoch), the fleet's key retirements and
-- its issuer-domain events, and a witness holds each list to "only ever grew". An agent recorded
-- revoked already would sort ahead of revocations committed to (its epoch is stamped only when
-- a row is revoked), and a row of megabytes would put every answer of the log's commitments
-- past what a witness reads. So: an agent is recorded unrevoked, and no id, kid or event field
-- is longer than any the service writes.
CREATE FUNCTION committed_rows_short_and_last() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'agents' THEN
        IF NEW.revoked_at IS NOT NULL OR length(NEW.id) > 64 THEN
            RAISE EXCEPTION 'an agent is recorded unrevoked (a revocation is final), with an id of at most 64 characters';
        END IF;
    ELSIF TG_TABLE_NAME = 'signing_keys' THEN
        IF length(NEW.kid) > 64 THEN
            RAISE EXCEPTION 'a signing key''s kid is at most 64 characters';
        END IF;
    ELSIF length(NEW.domain) > 253 OR length(NEW.org_id) > 64 OR length(NEW.kind) > 16
          OR length(COALESCE(NEW.method, '')) > 16 OR length(COALESCE(NEW.reason, '')) > 256 THEN
        RAISE EXCEPTION 'an issuer-domain event''s fields are no longer than the service writes';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER agents_recorded_unrevoked BEFORE INSERT ON agents
    FOR EACH ROW EXECUTE FUNCTION committed_rows_short_and_last();
CREATE TRIGGER signing_keys_kid_short BEFORE INSERT ON signing_keys
    FOR EACH ROW EXECUTE FUNCTION committed_rows_short_and_last();
CREATE TRIGGER domain_events_short BEFORE INSERT ON domain_events
    FOR EACH ROW EXECUTE FUNCTION committed_rows_short_and_last();
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION committed_rows_short_and_last() SET search_path = pg_catalog, %I, pg_temp',
                   current_schema());
END;
$$;
