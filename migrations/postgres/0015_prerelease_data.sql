-- Data written before 0.1.0, brought to what this version reads. To be removed in 0.2.0: a
-- database must then have run 0.1.x first, and this file becomes a check that nothing of
-- the kind is left.

-- 1. The per-record audit log of schemas 1 and 2, which blocks replaced (migration 3). An
--    empty one, as every database migration 1 created has, is dropped. One that holds
--    records was written by a pre-release version: the migration fails and leaves every
--    table as it was.
DO $$
BEGIN
    IF to_regclass('audit_log') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM audit_log) THEN
            RAISE EXCEPTION 'this database holds a per-record audit log (schema 1 or 2, written by a pre-release version), which this version does not read; its tables are unchanged';
        END IF;
    END IF;
END $$;
DROP TABLE IF EXISTS audit_counts;
DROP TABLE IF EXISTS audit_log;

-- 2. Agents registered before status lists (migration 11) have no place. Each mode's get a
--    list of their own, full from the start so that no new agent is drawn into it, in an
--    order that says nothing of when they registered.
CREATE TEMP TABLE prerelease_places ON COMMIT DROP AS
SELECT id, mode, ROW_NUMBER() OVER (PARTITION BY mode ORDER BY random()) - 1 AS idx
FROM agents WHERE status_list IS NULL;
CREATE TEMP TABLE prerelease_lists ON COMMIT DROP AS
SELECT mode, 'sl_' || substr(md5(random()::text || mode), 1, 26) AS id, ((COUNT(*) + 7) / 8) * 8 AS size
FROM prerelease_places GROUP BY mode;
INSERT INTO status_lists (id, size, allocated, created_at, mode)
SELECT id, size, size, 0, mode FROM prerelease_lists;
UPDATE agents a SET status_list = l.id, status_idx = p.idx
FROM prerelease_places p JOIN prerelease_lists l ON l.mode = p.mode
WHERE a.id = p.id;
