-- agentid schema, PostgreSQL. Times are Unix milliseconds.

CREATE TABLE orgs (
    id                 TEXT PRIMARY KEY,
    name               TEXT NOT NULL,
    plan               TEXT NOT NULL,
    verify_limit       BIGINT NOT NULL,
    other_limit        BIGINT NOT NULL,
    max_expiry_seconds BIGINT NOT NULL,
    created_at         BIGINT NOT NULL
);

-- Keys are stored only as SHA-256 of the whole key; `hint` is the prefix and last 4 characters.
CREATE TABLE api_keys (
    key_hash    BYTEA PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES orgs (id),
    kind        TEXT NOT NULL CHECK (kind IN ('secret', 'publishable')),
    mode        TEXT NOT NULL CHECK (mode IN ('live', 'test')),
    hint        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    disabled_at BIGINT
);

CREATE TABLE agents (
    id                 TEXT PRIMARY KEY,
    org_id             TEXT NOT NULL REFERENCES orgs (id),
    mode               TEXT NOT NULL CHECK (mode IN ('live', 'test')),
    name               TEXT NOT NULL,
    issuer_domain      TEXT NOT NULL,
    description        TEXT NOT NULL,
    scopes             TEXT NOT NULL, -- JSON array of strings
    created_at         BIGINT NOT NULL,
    issued_at          BIGINT NOT NULL,
    expires_at         BIGINT NOT NULL,
    revoked_at         BIGINT,
    revocation_reason  TEXT,
    verification_count BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX agents_by_org ON agents (org_id, mode, id);
CREATE INDEX agents_revoked ON agents (revoked_at) WHERE revoked_at IS NOT NULL;

-- One hash chain per ledger (org_id, mode); org_id '' is the service's own ledger.
CREATE TABLE audit_log (
    org_id         TEXT NOT NULL,
    mode           TEXT NOT NULL,
    seq            BIGINT NOT NULL,
    id             TEXT NOT NULL,
    agent_id       TEXT NOT NULL,
    result         TEXT NOT NULL CHECK (result IN ('valid', 'invalid', 'expired', 'revoked')),
    failure_reason TEXT,
    latency_us     BIGINT NOT NULL,
    requested_at   BIGINT NOT NULL,
    prev_hash      BYTEA NOT NULL,
    hash           BYTEA NOT NULL,
    PRIMARY KEY (org_id, mode, seq)
);
-- Log pages walk these newest first. Failures get indexes of their own (partial: a valid
-- record, the bulk of the traffic, does not pay for them); a page of valid records walks the
-- primary key or audit_by_agent and skips the failures in between.
CREATE INDEX audit_by_agent ON audit_log (org_id, mode, agent_id, seq);
CREATE INDEX audit_failed_by_result ON audit_log (org_id, mode, result, seq) WHERE result <> 'valid';
CREATE INDEX audit_failed_by_agent ON audit_log (org_id, mode, agent_id, result, seq) WHERE result <> 'valid';

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END;
$$;
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();

-- Exact totals for GET /v1/log without scanning: '' in agent_id or result means "any".
CREATE TABLE audit_counts (
    org_id   TEXT NOT NULL,
    mode     TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    result   TEXT NOT NULL,
    n        BIGINT NOT NULL,
    PRIMARY KEY (org_id, mode, agent_id, result)
);
