-- The Shared Signals outbox holds only what is owed, and each stream keeps its own counts,
-- so that neither the bound nor the deliverer's "is anything due?" costs more as events wait.
--   pending      events the stream is owed (rows of ssf_events);
--   dropped      events dropped, oldest first, because the stream was owed 10,000 already;
--   next_due_at  when the stream's oldest event is due (NULL when it is owed none).
-- An event delivered, acknowledged, refused for good, given up or dropped is deleted.
DELETE FROM ssf_events WHERE done_at IS NOT NULL;
-- Streams owed more than the bound keep their newest 10,000 (the older were never counted).
DELETE FROM ssf_events WHERE seq IN (
    SELECT seq FROM (
        SELECT seq, ROW_NUMBER() OVER (PARTITION BY stream_id ORDER BY seq DESC) AS newer
        FROM ssf_events) ranked
    WHERE newer > 10000);
DROP INDEX ssf_events_pending;
ALTER TABLE ssf_events DROP COLUMN done_at;
CREATE INDEX ssf_events_stream ON ssf_events (stream_id, seq);

ALTER TABLE ssf_streams ADD COLUMN pending BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ssf_streams ADD COLUMN dropped BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ssf_streams ADD COLUMN next_due_at BIGINT;
UPDATE ssf_streams SET
    pending = (SELECT COUNT(*) FROM ssf_events e WHERE e.stream_id = ssf_streams.id),
    next_due_at = (SELECT e.next_attempt_at FROM ssf_events e WHERE e.stream_id = ssf_streams.id
                   ORDER BY e.seq LIMIT 1);
CREATE INDEX ssf_streams_due ON ssf_streams (next_due_at) WHERE next_due_at IS NOT NULL;
