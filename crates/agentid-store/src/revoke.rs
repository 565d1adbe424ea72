//! A revocation, inside its transaction: the agent's row, and the Shared Signals events it
//! owes. Every path that revokes (the API's revoke, a name changing hands) comes here, so the
//! rule of which streams get an event is this file's `RECIPIENTS`, one statement both
//! backends run.

/// The streams that get an event when the agent `$1` of organization `$2`, mode `$3`, is
/// revoked: that organization's and mode's streams that carry revocations, enabled or paused
/// (a disabled stream drops its events), with no subjects or with the agent among them.
pub(crate) const RECIPIENTS: &str = "SELECT s.id FROM ssf_streams s \
     WHERE s.org_id = $2 AND s.mode = $3 AND s.revocations \
     AND s.status IN ('enabled', 'paused') \
     AND (NOT EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id) \
          OR EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id AND x.agent_id = $1)) \
     ORDER BY s.id";
