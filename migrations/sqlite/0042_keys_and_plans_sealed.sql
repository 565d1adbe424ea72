-- API keys and organizations' plans are sealed by the key file: each row carries the key
-- file's MAC of what it grants (a key: its hash, organization, kind and mode; an organization:
-- its plan, its limits and when they were sealed). A key row or a plan written with database
-- access alone opens nothing. Rows written before this are marked (a MAC of one byte) until
-- an instance seals them; every row written from now on carries a MAC of 32 bytes. Seals
-- carry their time: the database takes one only within a minute of its clock, so an earlier
-- plan, copied back with its seal, is refused.
ALTER TABLE orgs ADD COLUMN mac BLOB NOT NULL DEFAULT X'';
ALTER TABLE orgs ADD COLUMN sealed_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN mac BLOB NOT NULL DEFAULT X'';
UPDATE orgs SET mac = X'00';
UPDATE api_keys SET mac = X'00';

CREATE TRIGGER orgs_written_sealed BEFORE INSERT ON orgs
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
  OR abs(NEW.sealed_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000
BEGIN
    SELECT RAISE(ABORT, 'an organization is written sealed, and its seal fresh');
END;
CREATE TRIGGER orgs_stay_sealed BEFORE UPDATE OF mac, sealed_at ON orgs
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
  OR abs(NEW.sealed_at - CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)) > 60000
BEGIN
    SELECT RAISE(ABORT, 'an organization is written sealed, and its seal fresh');
END;
CREATE TRIGGER api_keys_written_sealed BEFORE INSERT ON api_keys
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
BEGIN
    SELECT RAISE(ABORT, 'an API key is written sealed');
END;
CREATE TRIGGER api_keys_stay_sealed BEFORE UPDATE OF mac ON api_keys
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
BEGIN
    SELECT RAISE(ABORT, 'an API key is written sealed');
END;
