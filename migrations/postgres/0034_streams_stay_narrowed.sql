-- A stream that was given subjects carries their events alone, and goes on doing so when the
-- last of them is removed: removing a subject asks for fewer events, never for every agent's.
-- Whether a stream is narrowed was read from whether it had subject rows, so removing its
-- last subject widened it to the whole organization.
ALTER TABLE ssf_streams ADD COLUMN narrowed BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE ssf_streams SET narrowed = TRUE
WHERE EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = ssf_streams.id);
