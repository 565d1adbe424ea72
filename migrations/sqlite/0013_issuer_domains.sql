-- Issuer domains (see the PostgreSQL migration of the same number).
CREATE TABLE domain_claims (
    org_id     TEXT NOT NULL REFERENCES orgs (id),
    domain     TEXT NOT NULL,
    nonce      TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    attempts   TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (org_id, domain)
);

CREATE TABLE domain_events (
    seq        INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    domain     TEXT NOT NULL,
    org_id     TEXT NOT NULL,
    method     TEXT,
    at         INTEGER NOT NULL,
    claimed_at INTEGER NOT NULL,
    reason     TEXT,
    mac        BLOB
);
CREATE INDEX domain_events_domain ON domain_events (domain, seq);
CREATE INDEX domain_events_org ON domain_events (org_id, seq);

INSERT INTO domain_events (seq, kind, domain, org_id, method, at, claimed_at)
SELECT ROW_NUMBER() OVER (ORDER BY issuer_domain), 'hold', issuer_domain, MIN(org_id), 'existing',
       MIN(created_at), MIN(created_at)
FROM agents GROUP BY issuer_domain HAVING COUNT(DISTINCT org_id) = 1;
INSERT INTO domain_events (seq, kind, domain, org_id, at, claimed_at)
SELECT COALESCE(MAX(seq), 0) + 1, 'migrated', '', '',
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
       CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
FROM domain_events;

CREATE TRIGGER domain_events_are_sealed BEFORE INSERT ON domain_events
WHEN NEW.mac IS NULL OR EXISTS (SELECT 1 FROM domain_events WHERE seq = NEW.seq)
BEGIN
    SELECT RAISE(ABORT, 'an issuer-domain event is sealed by the service, and never replaced');
END;
CREATE TRIGGER domain_events_no_update BEFORE UPDATE ON domain_events
BEGIN
    SELECT RAISE(ABORT, 'the issuer-domain holdings are append-only');
END;
CREATE TRIGGER domain_events_no_delete BEFORE DELETE ON domain_events
BEGIN
    SELECT RAISE(ABORT, 'the issuer-domain holdings are append-only');
END;

ALTER TABLE status_lists ADD COLUMN mode TEXT NOT NULL DEFAULT 'live';
CREATE INDEX status_lists_newest ON status_lists (mode, created_at);
CREATE TRIGGER status_lists_mode_is_fixed BEFORE UPDATE OF mode ON status_lists
WHEN NEW.mode IS NOT OLD.mode
BEGIN
    SELECT RAISE(ABORT, 'a status list is kept as it is');
END;
