-- An agent has one current client secret (no expiry): two rotations at once each expired the
-- secrets they saw and added their own, so both new ones stayed current for good. The second
-- now meets this index and runs again, expiring the first. Pairs already made keep the newest
-- current; the others expire 24 h after they were made, as a replaced secret does.
UPDATE client_secrets SET expires_at = created_at + 86400000
WHERE expires_at IS NULL AND EXISTS (
    SELECT 1 FROM client_secrets newer
    WHERE newer.agent_id = client_secrets.agent_id AND newer.expires_at IS NULL
      AND (newer.created_at > client_secrets.created_at
           OR (newer.created_at = client_secrets.created_at AND newer.secret_hash > client_secrets.secret_hash))
);
CREATE UNIQUE INDEX client_secrets_one_current ON client_secrets (agent_id) WHERE expires_at IS NULL;
