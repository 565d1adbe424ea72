-- The identity providers each organization trusts to vouch for the people its agents act
-- for: an issuer (its `iss`, exactly, once an organization) and its keys, given inline
-- (`jwks`, JSON) or where it publishes them (`jwks_uri`). At most 10 an organization.
CREATE TABLE identity_providers (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL REFERENCES orgs (id),
    issuer     TEXT NOT NULL,
    jwks       TEXT,
    jwks_uri   TEXT,
    created_at BIGINT NOT NULL,
    UNIQUE (org_id, issuer)
);
