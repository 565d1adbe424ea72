-- Counters are kept per (agent, result) and per (any agent, result) only; totals over results and
-- an agent's verification_count are sums of at most four rows at read time. An audit batch then
-- writes one counter row per distinct (agent, result) and never the agent row.
DELETE FROM audit_counts WHERE result = '';

-- The service ledger (org_id '') counted a record naming no agent twice under agent_id '':
-- recount it from the log.
DELETE FROM audit_counts WHERE org_id = '';
INSERT INTO audit_counts (org_id, mode, agent_id, result, n)
    SELECT org_id, mode, '', result, COUNT(*) FROM audit_log WHERE org_id = '' GROUP BY org_id, mode, result;
INSERT INTO audit_counts (org_id, mode, agent_id, result, n)
    SELECT org_id, mode, agent_id, result, COUNT(*) FROM audit_log WHERE org_id = '' AND agent_id <> ''
    GROUP BY org_id, mode, agent_id, result;

ALTER TABLE agents DROP COLUMN verification_count;
