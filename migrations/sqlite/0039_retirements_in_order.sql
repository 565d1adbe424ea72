-- Retirements are committed to in the order of their times, and a key counts as retired from
-- its time on. A key recorded retired already, or a retirement dated before the last one, would
-- reorder what checkpoints committed to (every later one an alarm that no longer tells a real
-- undo from noise); one dated ahead of now would leave its key signing or validating until
-- then, and push every later retirement past it. The service retires a key at now (or just
-- after the last retirement); a minute ahead is left for the clocks of a fleet.
CREATE TRIGGER signing_keys_recorded_unretired BEFORE INSERT ON signing_keys
WHEN NEW.retired_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'a signing key is recorded unretired');
END;
CREATE TRIGGER signing_keys_retired_in_order BEFORE UPDATE OF retired_at ON signing_keys
WHEN OLD.retired_at IS NULL AND NEW.retired_at IS NOT NULL
  AND (NEW.retired_at <= COALESCE((SELECT MAX(retired_at) FROM signing_keys), NEW.retired_at - 1)
       OR NEW.retired_at > CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + 60000)
BEGIN
    SELECT RAISE(ABORT, 'a retirement is dated after the last one, and not ahead of now');
END;
