-- Token Status Lists (see the PostgreSQL migration of the same number).
CREATE TABLE status_lists (
    id         TEXT PRIMARY KEY,
    size       INTEGER NOT NULL CHECK (size > 0),
    allocated  INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
);
ALTER TABLE agents ADD COLUMN status_list TEXT REFERENCES status_lists (id);
ALTER TABLE agents ADD COLUMN status_idx INTEGER;
CREATE UNIQUE INDEX agents_status_place ON agents (status_list, status_idx) WHERE status_list IS NOT NULL;

CREATE TRIGGER agents_status_place_is_fixed BEFORE UPDATE OF status_list, status_idx ON agents
WHEN OLD.status_list IS NOT NULL
 AND (NEW.status_list IS NOT OLD.status_list OR NEW.status_idx IS NOT OLD.status_idx)
BEGIN
    SELECT RAISE(ABORT, 'an agent''s status place never changes');
END;
CREATE TRIGGER status_lists_are_kept BEFORE UPDATE ON status_lists
WHEN NEW.id IS NOT OLD.id OR NEW.size IS NOT OLD.size OR NEW.allocated < OLD.allocated
BEGIN
    SELECT RAISE(ABORT, 'a status list is kept as it is');
END;
CREATE TRIGGER status_lists_no_delete BEFORE DELETE ON status_lists
BEGIN
    SELECT RAISE(ABORT, 'a status list is kept as it is');
END;
CREATE TRIGGER status_lists_no_replace BEFORE INSERT ON status_lists
WHEN EXISTS (SELECT 1 FROM status_lists WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'a status list is kept as it is');
END;
