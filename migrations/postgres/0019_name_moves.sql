-- Names that changed hands whose former holders' agents are still being revoked. The
-- transaction that moves a name (under the lock every change of who holds what takes)
-- writes the row; the revocations follow in bounded batches outside that lock, and the
-- batch that revokes the last of those agents deletes it. A row left by a stopped
-- instance is taken up by any instance.
CREATE TABLE name_moves (
    -- The hold's issuer-domain event.
    seq BIGINT PRIMARY KEY,
    -- The new holder: its own agents stay.
    org_id TEXT NOT NULL,
    domain TEXT NOT NULL,
    -- The names below it move too.
    below BOOLEAN NOT NULL,
    -- When the name changed hands (Unix ms): the revoked agents' revoked_at.
    at BIGINT NOT NULL
);
