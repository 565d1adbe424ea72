-- OpenID Shared Signals: an organization's streams to its receivers, and the outbox of the
-- Security Event Tokens each stream is owed. A revocation writes its events in its own
-- transaction (the trigger below), so none is lost to a crash between the two.
CREATE TABLE ssf_streams (
    id                TEXT PRIMARY KEY,
    org_id            TEXT NOT NULL REFERENCES orgs (id),
    mode              TEXT NOT NULL,
    aud               TEXT NOT NULL,
    method            TEXT NOT NULL,   -- urn:ietf:rfc:8935 (push) or urn:ietf:rfc:8936 (poll)
    endpoint_url      TEXT,            -- push: where SETs go
    poll_token_hash   BYTEA,           -- poll: SHA-256 of the token, shown once
    events_requested  TEXT NOT NULL,   -- a JSON array
    revocations       BOOLEAN NOT NULL, -- session-revoked is among the events delivered
    description       TEXT,
    status            TEXT NOT NULL,   -- enabled, paused (events kept) or disabled (dropped)
    created_at        BIGINT NOT NULL,
    lease_until       BIGINT           -- an instance delivering its events until then
);
CREATE INDEX ssf_streams_org ON ssf_streams (org_id, mode);

CREATE TABLE ssf_subjects (
    stream_id TEXT NOT NULL REFERENCES ssf_streams (id) ON DELETE CASCADE,
    agent_id  TEXT NOT NULL,
    PRIMARY KEY (stream_id, agent_id)
);

CREATE TABLE ssf_events (
    seq             BIGSERIAL PRIMARY KEY,
    stream_id       TEXT NOT NULL REFERENCES ssf_streams (id) ON DELETE CASCADE,
    jti             TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL,     -- session-revoked or verification
    agent_id        TEXT,
    issuer          TEXT,
    reason          TEXT,
    state           TEXT,
    event_at        BIGINT NOT NULL,   -- the revocation's time (ms)
    attempts        INT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    done_at         BIGINT             -- delivered, acknowledged, refused for good or dropped
);
CREATE INDEX ssf_events_pending ON ssf_events (stream_id, seq) WHERE done_at IS NULL;

CREATE FUNCTION ssf_revocation_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ssf_events (stream_id, jti, kind, agent_id, issuer, reason, event_at, next_attempt_at)
    SELECT s.id, gen_random_uuid()::text, 'session-revoked', NEW.id, NEW.issuer_domain,
           NEW.revocation_reason, NEW.revoked_at, NEW.revoked_at
    FROM ssf_streams s
    WHERE s.org_id = NEW.org_id AND s.mode = NEW.mode AND s.revocations
      AND s.status IN ('enabled', 'paused')
      AND (NOT EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id)
           OR EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id AND x.agent_id = NEW.id))
    ORDER BY s.id;
    RETURN NULL;
END;
$$;
CREATE TRIGGER agents_ssf_events AFTER UPDATE ON agents
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION ssf_revocation_events();
