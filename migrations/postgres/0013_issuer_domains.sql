-- Issuer domains: an organization issues only under names it holds. A name is held by
-- proving it (DNS or HTTPS) or by the operator's grant; who holds what is an append-only
-- list of events, each with a MAC under a key derived from the signing key file, so that a
-- row written with database access alone counts for nothing.
CREATE TABLE domain_claims (
    org_id     TEXT NOT NULL REFERENCES orgs (id),
    domain     TEXT NOT NULL,
    nonce      TEXT NOT NULL,             -- the challenge value is derived from it
    created_at BIGINT NOT NULL,
    attempts   TEXT NOT NULL DEFAULT '',  -- times (ms) of the verification attempts of the last minute
    PRIMARY KEY (org_id, domain)
);

CREATE TABLE domain_events (
    seq        BIGINT PRIMARY KEY,
    kind       TEXT NOT NULL,             -- hold, release, migrated
    domain     TEXT NOT NULL,
    org_id     TEXT NOT NULL,
    method     TEXT,                      -- hold: dns, https, operator, existing
    at         BIGINT NOT NULL,
    claimed_at BIGINT NOT NULL,
    reason     TEXT,                      -- release: why
    mac        BYTEA                      -- NULL only for what this migration carries over
);
CREATE INDEX domain_events_domain ON domain_events (domain, seq);
CREATE INDEX domain_events_org ON domain_events (org_id, seq);

-- The names agents already use go to their organization where exactly one organization used
-- the name (that name alone); a name two or more used goes to none of them. The list of what
-- was carried over is closed by a `migrated` event: nothing unsealed after it counts.
INSERT INTO domain_events (seq, kind, domain, org_id, method, at, claimed_at)
SELECT ROW_NUMBER() OVER (ORDER BY issuer_domain), 'hold', issuer_domain, MIN(org_id), 'existing',
       MIN(created_at), MIN(created_at)
FROM agents GROUP BY issuer_domain HAVING COUNT(DISTINCT org_id) = 1;
INSERT INTO domain_events (seq, kind, domain, org_id, at, claimed_at)
SELECT COALESCE(MAX(seq), 0) + 1, 'migrated', '', '',
       (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT,
       (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
FROM domain_events;

CREATE FUNCTION domain_events_are_appended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.mac IS NULL THEN
            RAISE EXCEPTION 'an issuer-domain event is sealed by the service';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the issuer-domain holdings are append-only';
END;
$$;
CREATE TRIGGER domain_events_are_appended BEFORE INSERT OR UPDATE OR DELETE ON domain_events
    FOR EACH ROW EXECUTE FUNCTION domain_events_are_appended();
CREATE TRIGGER domain_events_no_truncate BEFORE TRUNCATE ON domain_events
    FOR EACH STATEMENT EXECUTE FUNCTION domain_events_are_appended();

-- Test-mode agents get places in lists of their own: a test revocation changes no list that
-- live tokens point at. Lists made before are live lists.
ALTER TABLE status_lists ADD COLUMN mode TEXT NOT NULL DEFAULT 'live';
CREATE INDEX status_lists_newest ON status_lists (mode, created_at);
CREATE FUNCTION status_lists_mode_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.mode IS DISTINCT FROM OLD.mode THEN
        RAISE EXCEPTION 'a status list is kept as it is';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER status_lists_mode_is_fixed BEFORE UPDATE ON status_lists
    FOR EACH ROW EXECUTE FUNCTION status_lists_mode_is_fixed();
