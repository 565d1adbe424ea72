-- A signing key's public key is 32 bytes (Ed25519). A row with another was written with
-- database access alone, and no instance could start with it (a row that does not read
-- stops the read of every key), nor the checkpointer read the retired keys it commits to;
-- nor can it be deleted. The database refuses it.
CREATE TRIGGER signing_keys_are_keys BEFORE INSERT ON signing_keys
WHEN typeof(NEW.public_key) IS NOT 'blob' OR length(NEW.public_key) IS NOT 32
BEGIN
    SELECT RAISE(ABORT, 'a signing key''s public key is 32 bytes');
END;
