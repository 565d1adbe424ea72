-- A revocation's Shared Signals events are queued by the store (see the PostgreSQL migration
-- of the same number).
DROP TRIGGER agents_ssf_events;
