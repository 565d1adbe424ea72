-- Log rows as the service writes them. A checkpoint row that did not decode (a root not of 32
-- bytes, a negative size, a value of another type) failed every read of its ledger's
-- checkpoints: no checkpoint came after it, the log's endpoints answered 500 and the witness
-- could check nothing. One dated ahead of now (a replayed note of the empty tree) held the
-- checkpointer off its ledger until then, with no alarm. An audit block before seq 1 sorted
-- ahead of every record, listed by the log and read by nothing that checks it. A minute ahead
-- is left for the clocks of a fleet.
CREATE TRIGGER audit_checkpoints_as_written BEFORE INSERT ON audit_checkpoints
WHEN typeof(NEW.tree_size) != 'integer' OR NEW.tree_size < 0
  OR typeof(NEW.root) != 'blob' OR length(NEW.root) != 32
  OR typeof(NEW.created_at) != 'integer' OR NEW.created_at < 0
  OR NEW.created_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 60000
BEGIN
    SELECT RAISE(ABORT, 'a checkpoint has a size, a 32-byte root and a time not ahead of now');
END;
CREATE TRIGGER audit_blocks_from_seq_one BEFORE INSERT ON audit_blocks
WHEN typeof(NEW.first_seq) != 'integer' OR NEW.first_seq < 1
  OR typeof(NEW.last_seq) != 'integer' OR NEW.last_seq < NEW.first_seq
BEGIN
    SELECT RAISE(ABORT, 'an audit block holds records from seq 1 on');
END;
