-- A removed identity provider stays removed. Its row carries the key file's MAC of its own
-- members only, so the row as it was before its removal (a leaked key's provider, say) would
-- vouch again if put back: each removal leaves a note, kept for good, and a provider whose
-- id has one is never inserted again. Trusted again through the API, a provider is a new row
-- under a new id.
CREATE TABLE identity_provider_removals (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL,
    removed_at BIGINT NOT NULL
);
CREATE FUNCTION identity_provider_removals_are_kept() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'a removed identity provider stays removed';
END;
$$;
CREATE TRIGGER identity_provider_removals_are_kept BEFORE UPDATE OR DELETE ON identity_provider_removals
    FOR EACH ROW EXECUTE FUNCTION identity_provider_removals_are_kept();
CREATE TRIGGER identity_provider_removals_no_truncate BEFORE TRUNCATE ON identity_provider_removals
    FOR EACH STATEMENT EXECUTE FUNCTION identity_provider_removals_are_kept();
CREATE FUNCTION identity_providers_not_back() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM identity_provider_removals WHERE id = NEW.id) THEN
        RAISE EXCEPTION 'a removed identity provider stays removed';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER identity_providers_not_back BEFORE INSERT OR UPDATE ON identity_providers
    FOR EACH ROW EXECUTE FUNCTION identity_providers_not_back();
