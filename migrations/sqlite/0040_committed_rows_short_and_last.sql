-- Checkpoints commit to the ledger's revocations (by epoch), the fleet's key retirements and
-- its issuer-domain events, and a witness holds each list to "only ever grew". An agent recorded
-- revoked already would sort ahead of revocations committed to (its epoch is stamped only when
-- a row is revoked), and a row of megabytes would put every answer of the log's commitments
-- past what a witness reads. So: an agent is recorded unrevoked, and no id, kid or event field
-- is longer than any the service writes.
CREATE TRIGGER agents_recorded_unrevoked BEFORE INSERT ON agents
WHEN NEW.revoked_at IS NOT NULL OR length(NEW.id) > 64
BEGIN
    SELECT RAISE(ABORT, 'an agent is recorded unrevoked (a revocation is final), with an id of at most 64 characters');
END;
CREATE TRIGGER signing_keys_kid_short BEFORE INSERT ON signing_keys
WHEN length(NEW.kid) > 64
BEGIN
    SELECT RAISE(ABORT, 'a signing key''s kid is at most 64 characters');
END;
CREATE TRIGGER domain_events_short BEFORE INSERT ON domain_events
WHEN length(NEW.domain) > 253 OR length(NEW.org_id) > 64 OR length(NEW.kind) > 16
  OR length(COALESCE(NEW.method, '')) > 16 OR length(COALESCE(NEW.reason, '')) > 256
BEGIN
    SELECT RAISE(ABORT, 'an issuer-domain event''s fields are no longer than the service writes');
END;
