-- The revocation epoch: one counter that every revocation moves, in the revocation's own
-- transaction, and stamps on the revoked agent (see the PostgreSQL migration of the same
-- number). SQLite cannot assign NEW in a trigger, so the stamp is written after the update.
CREATE TABLE revocation_epoch (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT INTO revocation_epoch (id, epoch) VALUES (1, 0);

ALTER TABLE agents ADD COLUMN revoked_epoch INTEGER;
CREATE INDEX agents_revoked_epoch ON agents (revoked_epoch) WHERE revoked_epoch IS NOT NULL;

CREATE TRIGGER agents_revocation_epoch AFTER UPDATE OF revoked_at ON agents
WHEN OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL
BEGIN
    UPDATE revocation_epoch SET epoch = epoch + 1 WHERE id = 1;
    UPDATE agents SET revoked_epoch = (SELECT epoch FROM revocation_epoch WHERE id = 1) WHERE id = NEW.id;
END;
