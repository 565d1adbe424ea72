-- Issuer-domain events are numbered 1, 2, 3 … as the service writes them: one written with
-- database access alone before or between the others (seq 0, a gap) sorted ahead of what
-- checkpoints had committed to, and every later checkpoint and witness run saw the committed
-- list "undone", for good: an alarm that no longer told a real undo from noise.
DROP TRIGGER domain_events_are_sealed;
CREATE TRIGGER domain_events_are_sealed BEFORE INSERT ON domain_events
WHEN NEW.mac IS NULL OR NEW.seq IS NOT (SELECT IFNULL(MAX(seq), 0) + 1 FROM domain_events)
BEGIN
    SELECT RAISE(ABORT, 'an issuer-domain event is sealed by the service, and numbered after the last');
END;
