//! A revocation, inside its transaction: the agent's row, and the Shared Signals events it
//! owes. Every path that revokes (the API's revoke, a name changing hands) comes here. Which
//! streams get an event is core's rule (`streams::receives_revocation`), applied to the facts
//! `STREAM_FACTS` reads.

/// The streams of organization `$2`, mode `$3`, with what the rule needs of each for the
/// agent `$1`: status, whether it carries revocations, was narrowed to subjects, and names
/// the agent.
pub(crate) const STREAM_FACTS: &str = "SELECT s.id, s.status, s.revocations, s.narrowed, \
     EXISTS (SELECT 1 FROM ssf_subjects x WHERE x.stream_id = s.id AND x.agent_id = $1) \
     FROM ssf_streams s WHERE s.org_id = $2 AND s.mode = $3 ORDER BY s.id";
