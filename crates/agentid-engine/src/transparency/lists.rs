//! What a ledger's checkpoints commit to besides its records, as the database holds it now:
//! the ledger's revocations, the fleet's key retirements and its issuer-domain events.

use agentid_core::domain::{Ledger, Millis};
use agentid_core::tlog::commit::{self, Commitment, Commitments, List};
use agentid_store::{SharedStore, StoreError, StoredCheckpoint};

use agentid_core::tlog::note::LogVerifier;

/// The lists a checkpoint of a ledger commits to, as the database holds them now.
#[derive(Debug, Default)]
pub struct CommittedLists {
    /// The ledger's revocations, in revocation order.
    pub revocations: Vec<(String, Millis)>,
    /// The fleet's retired keys, by time of retirement (then kid).
    pub retired_keys: Vec<(String, Millis)>,
    /// The fleet's issuer-domain holding events, in order.
    pub domains: Vec<(String, Millis)>,
}

impl CommittedLists {
    pub fn commitments(&self) -> Commitments {
        let of = |list| Commitment::of(list, self.get(list).iter().map(|(id, at)| (id.as_str(), *at)));
        Commitments {
            revocations: of(List::Revocations),
            retired_keys: of(List::RetiredKeys),
            domains: of(List::Domains),
        }
    }

    /// One list's entries.
    pub fn get(&self, list: List) -> &[(String, Millis)] {
        match list {
            List::Revocations => &self.revocations,
            List::RetiredKeys => &self.retired_keys,
            List::Domains => &self.domains,
        }
    }
}

/// Reads the lists a checkpoint of `ledger` commits to.
pub async fn committed_lists(store: &SharedStore, ledger: &Ledger) -> Result<CommittedLists, StoreError> {
    let mut retired_keys: Vec<(String, Millis)> = store
        .signing_keys()
        .await?
        .into_iter()
        .filter_map(|k| Some((k.kid, k.retired_at?)))
        .collect();
    retired_keys.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    // Every row as it is stored, one that does not read too: undoing it is caught as well.
    let domains = store
        .domain_events()
        .await?
        .into_iter()
        .map(|e| match e {
            Ok(e) => (e.commitment_id(), e.at),
            Err(u) => (u.commitment_id, u.at),
        })
        .collect();
    Ok(CommittedLists {
        revocations: store.revocations_of(ledger).await?,
        retired_keys,
        domains,
    })
}

/// What no longer holds of what the latest checkpoint committed to, as `(what, message)`
/// integrity alarms. A revocation or a retirement undone in the database is an alarm (the new
/// checkpoint is signed over what the database holds, so the witness and `audit verify` catch
/// it too).
pub(super) fn broken_commitments(
    verifier: &LogVerifier,
    ledger: &Ledger,
    latest: &StoredCheckpoint,
    lists: &CommittedLists,
) -> Vec<(&'static str, String)> {
    let mut alarms = Vec::new();
    let Ok(cp) = verifier.open(&latest.note) else {
        return alarms; // not a note of this key: `audit verify` reports it
    };
    let Ok(Some(old)) = Commitments::parse(&cp.extensions) else {
        return alarms;
    };
    if !commit::holds(List::Revocations, &lists.revocations, &old.revocations) {
        alarms.push((
            "revocation",
            format!(
                "ledger {ledger}: the database no longer holds the {} revocations the checkpoint of {} \
                 records commits to: a revocation was undone",
                old.revocations.count, latest.size
            ),
        ));
    }
    if !commit::holds(List::RetiredKeys, &lists.retired_keys, &old.retired_keys) {
        alarms.push((
            "retired_key",
            format!(
                "the database no longer holds the {} key retirements the checkpoint of {} records of \
                 {ledger} commits to: a retirement was undone",
                old.retired_keys.count, latest.size
            ),
        ));
    }
    if !commit::holds(List::Domains, &lists.domains, &old.domains) {
        alarms.push((
            "domain_event",
            format!(
                "the database no longer holds the {} issuer-domain events the checkpoint of {} records \
                 of {ledger} commits to: who holds a name was rewritten",
                old.domains.count, latest.size
            ),
        ));
    }
    alarms
}
