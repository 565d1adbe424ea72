-- Data written before 0.1.0, brought to what this version reads (see the PostgreSQL
-- migration of the same number). To be removed in 0.2.0: a database must then have run
-- 0.1.x first, and this file becomes a check that nothing of the kind is left.

-- 1. The per-record audit log of schemas 1 and 2, which blocks replaced (migration 3). An
--    empty one, as every database migration 1 created has, is dropped. One that holds
--    records was written by a pre-release version: the migration fails on the named
--    constraint and leaves every table as it was.
CREATE TABLE IF NOT EXISTS audit_log (seq INTEGER);
CREATE TABLE IF NOT EXISTS audit_counts (seq INTEGER);
CREATE TEMP TABLE prerelease_log (
    held INTEGER CONSTRAINT "this database holds a per-record audit log (schema 1 or 2, written by a pre-release version), which this version does not read; its tables are unchanged" CHECK (held = 0)
);
INSERT INTO prerelease_log SELECT EXISTS (SELECT 1 FROM audit_log);
DROP TABLE prerelease_log;
DROP TABLE audit_counts;
DROP TABLE audit_log;

-- 2. Agents registered before status lists (migration 11) have no place. Each mode's get a
--    list of their own, full from the start so that no new agent is drawn into it, in an
--    order that says nothing of when they registered.
CREATE TEMP TABLE prerelease_places AS
SELECT id, mode, ROW_NUMBER() OVER (PARTITION BY mode ORDER BY random()) - 1 AS idx
FROM agents WHERE status_list IS NULL;
CREATE TEMP TABLE prerelease_lists AS
SELECT mode, 'sl_' || lower(hex(randomblob(13))) AS id, ((COUNT(*) + 7) / 8) * 8 AS size
FROM prerelease_places GROUP BY mode;
INSERT INTO status_lists (id, size, allocated, created_at, mode)
SELECT id, size, size, 0, mode FROM prerelease_lists;
UPDATE agents SET
    status_list = (SELECT l.id FROM prerelease_lists l WHERE l.mode = agents.mode),
    status_idx = (SELECT p.idx FROM prerelease_places p WHERE p.id = agents.id)
WHERE status_list IS NULL;
DROP TABLE prerelease_places;
DROP TABLE prerelease_lists;
