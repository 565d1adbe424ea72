-- Every block of the audit log is sealed by the service: `mac` is the key file's MAC of the
-- block's place in its ledger and the chain's hashes at its ends. A record written with
-- database access alone chains as well as the service's (the chain is SHA-256, which anyone
-- can compute), so without a seal the next checkpoint signed it and `audit verify` passed it.
-- Blocks written before this migration have none; every block after it must.
ALTER TABLE audit_blocks ADD COLUMN mac BLOB;
CREATE TRIGGER audit_blocks_are_sealed BEFORE INSERT ON audit_blocks
WHEN NEW.mac IS NULL
BEGIN
    SELECT RAISE(ABORT, 'an audit block is sealed by the service');
END;
