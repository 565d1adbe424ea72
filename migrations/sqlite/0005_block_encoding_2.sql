-- Audit blocks are now written in encoding version 2 (src/store/block.rs): a string table and
-- 16-byte ids, ~54 bytes a record instead of 118. Nothing to convert: version 1 blocks are
-- still read. This migration exists so that a binary that cannot read version 2 refuses to
-- start on a database a newer one has written to (sqlx: a migration it does not know).
SELECT 1;
