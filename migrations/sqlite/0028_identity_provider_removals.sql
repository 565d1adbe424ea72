-- A removed identity provider stays removed (see the PostgreSQL migration of the same
-- number). REPLACE deletes the row it conflicts with without firing delete triggers, but the
-- row it inserts still meets the insert trigger.
CREATE TABLE identity_provider_removals (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL,
    removed_at INTEGER NOT NULL
);
CREATE TRIGGER identity_provider_removals_are_kept BEFORE DELETE ON identity_provider_removals
BEGIN
    SELECT RAISE(ABORT, 'a removed identity provider stays removed');
END;
CREATE TRIGGER identity_provider_removals_are_fixed BEFORE UPDATE ON identity_provider_removals
BEGIN
    SELECT RAISE(ABORT, 'a removed identity provider stays removed');
END;
CREATE TRIGGER identity_provider_removals_no_replace BEFORE INSERT ON identity_provider_removals
WHEN EXISTS (SELECT 1 FROM identity_provider_removals WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'a removed identity provider stays removed');
END;
CREATE TRIGGER identity_providers_not_back BEFORE INSERT ON identity_providers
WHEN EXISTS (SELECT 1 FROM identity_provider_removals WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'a removed identity provider stays removed');
END;
