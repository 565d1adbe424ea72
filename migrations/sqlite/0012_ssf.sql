-- OpenID Shared Signals (see the PostgreSQL migration of the same number).
CREATE TABLE ssf_streams (
    id                TEXT PRIMARY KEY,
    org_id            TEXT NOT NULL REFERENCES orgs (id),
    mode              TEXT NOT NULL,
    aud               TEXT NOT NULL,
    method            TEXT NOT NULL,
    endpoint_url      TEXT,
    poll_token_hash   BLOB,
    events_requested  TEXT NOT NULL,
    revocations       INTEGER NOT NULL,
    description       TEXT,
    status            TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    lease_until       INTEGER
);
CREATE INDEX ssf_streams_org ON ssf_streams (org_id, mode);

CREATE TABLE ssf_subjects (
    stream_id TEXT NOT NULL REFERENCES ssf_streams (id) ON DELETE CASCADE,
    agent_id  TEXT NOT NULL,
    PRIMARY KEY (stream_id, agent_id)
);

CREATE TABLE ssf_events (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream_id       TEXT NOT NULL REFERENCES ssf_streams (id) ON DELETE CASCADE,
    jti             TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL,
    agent_id        TEXT,
    issuer          TEXT,
    reason          TEXT,
    state           TEXT,
    event_at        INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    done_at         INTEGER
);
CREATE INDEX ssf_events_pending ON ssf_events (stream_id, seq) WHERE done_at IS NULL;

CREATE TRIGGER agents_ssf_events AFTER UPDATE OF revoked_at ON agents
WHEN OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL
BEGIN
    INSERT INTO ssf_events (stream_id, jti, kind, agent_id, issuer, reason, event_at, next_attempt_at)
    SELECT s.id, lower(hex(randomblob(16))), 'session-revoked', NEW.id, NEW.issuer_domain,
           NEW.revocation_reason, NEW.revoked_at, NEW.revoked_at
    FROM ssf_streams s
    WHERE s.org_id = NEW.org_id AND s.mode = NEW.mode AND s.revocations
      AND s.status IN ('enabled', 'paused')
      AND (NOT EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id)
           OR EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id AND x.agent_id = NEW.id))
    ORDER BY s.id;
END;
