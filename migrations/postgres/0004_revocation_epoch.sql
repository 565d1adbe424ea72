-- The revocation epoch: one counter that every revocation moves, in the revocation's own
-- transaction, and stamps on the revoked agent. An instance that knows every revocation up to
-- epoch K (its in-memory index) needs no per-agent look-up in an audit batch while the
-- committed epoch is still K: the batch statement re-checks revocation agent by agent only
-- when the epoch has moved past what its entries' checks had seen. The trigger does the
-- stamping, so a revocation made by any path (an older binary, a hand-written UPDATE) moves
-- the epoch too.
CREATE TABLE revocation_epoch (
    id    INT PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL
);
INSERT INTO revocation_epoch (id, epoch) VALUES (1, 0);

ALTER TABLE agents ADD COLUMN revoked_epoch BIGINT;
CREATE INDEX agents_revoked_epoch ON agents (revoked_epoch) WHERE revoked_epoch IS NOT NULL;

CREATE FUNCTION agents_stamp_revocation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE revocation_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch INTO NEW.revoked_epoch;
    RETURN NEW;
END;
$$;
CREATE TRIGGER agents_revocation_epoch BEFORE UPDATE ON agents
    FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION agents_stamp_revocation();
