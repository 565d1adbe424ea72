-- A signing key's public key is 32 bytes (Ed25519). A row with another was written with
-- database access alone, and no instance could start with it (a row that does not read
-- stops the read of every key), nor the checkpointer read the retired keys it commits to;
-- nor can it be deleted. The database refuses it (NOT VALID: a row already there could not
-- be deleted for the constraint to be added over it).
ALTER TABLE signing_keys ADD CONSTRAINT signing_keys_are_keys CHECK (octet_length(public_key) = 32) NOT VALID;
