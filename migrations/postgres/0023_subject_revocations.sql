-- The people whose delegated tokens an organization revoked: a person as their identity
-- provider names them (`iss`, `sub`), and when. A delegated token for them issued through the
-- organization's agents at or before `revoked_at` is refused online; one issued later (a new
-- sign-in) is not. Revoked again, the time moves forward.
CREATE TABLE subject_revocations (
    org_id     TEXT NOT NULL,
    iss        TEXT NOT NULL,
    sub        TEXT NOT NULL,
    revoked_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, iss, sub)
);
