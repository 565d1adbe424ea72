-- A revocation's Shared Signals events are queued by the store's revoke (one statement that
-- both backends run, `RECIPIENTS`), in the revocation's own transaction, so the rule of who
-- gets an event is written once.
DROP TRIGGER agents_ssf_events ON agents;
DROP FUNCTION ssf_revocation_events();
