-- A claim's verification attempts of the last minute, kept apart from the claim: they were a
-- column of the claim, so releasing a pending claim and claiming the name again started the
-- count afresh, and a caller looped claim, verify, release to have the service look up and
-- fetch a name (another's too) as often as its rate limit let it, not 10 times a minute.
-- A row goes once its last attempt is a minute old.
CREATE TABLE domain_attempts (
    org_id   TEXT NOT NULL,
    domain   TEXT NOT NULL,
    attempts TEXT NOT NULL,
    last_at  BIGINT NOT NULL,
    PRIMARY KEY (org_id, domain)
);
CREATE INDEX domain_attempts_by_time ON domain_attempts (last_at);
-- The claim's own column of attempts, which its release took with it.
ALTER TABLE domain_claims DROP COLUMN attempts;
