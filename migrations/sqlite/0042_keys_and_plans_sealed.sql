-- API keys and organizations' plans are sealed by the key file: each row carries the key
-- file's MAC of what it grants (a key: its hash, organization, kind and mode; an organization:
-- its plan and limits). A key row or a plan written with database access alone opens
-- nothing. Rows written before this hold an empty MAC until the first instance to start
-- seals them; every row written from now on carries one.
ALTER TABLE orgs ADD COLUMN mac BLOB NOT NULL DEFAULT X'';
ALTER TABLE api_keys ADD COLUMN mac BLOB NOT NULL DEFAULT X'';

CREATE TRIGGER orgs_written_sealed BEFORE INSERT ON orgs
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
BEGIN
    SELECT RAISE(ABORT, 'an organization is written sealed');
END;
CREATE TRIGGER orgs_stay_sealed BEFORE UPDATE OF mac ON orgs
WHEN typeof(NEW.mac) <> 'blob' OR length(NEW.mac) <> 32
BEGIN
    SELECT RAISE(ABORT, 'an organization is written sealed');
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
