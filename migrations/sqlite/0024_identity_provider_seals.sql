-- Each identity provider's row carries the key file's MAC of its members: a provider written
-- (or its keys changed) with database access alone vouches for no one. Rows added before
-- this have none, and are not trusted until added again.
ALTER TABLE identity_providers ADD COLUMN mac BLOB;
