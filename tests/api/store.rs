//! Store conformance: the same expectations of the `Store` trait on whichever backend runs.

use std::collections::HashMap;

use agentid::domain::audit::{AuditEntry, Event};
use agentid::domain::{KeyMode, Ledger, Millis, VerifyResult};
use agentid::engine::domains::Rules;
use agentid::store::{AgentRecord, LogQuery};

use crate::helpers::spawn_app;

/// Seals blocks with `app`'s key file, as its engine does.
fn sealer(app: &crate::helpers::TestApp) -> agentid::store::BlockSealer {
    let keys = agentid::keys::KeyRing::load(&app.config.signing_key_file)
        .unwrap()
        .unwrap();
    std::sync::Arc::new(keys.audit_block_sealer())
}

/// A live agent row as the store keeps it (long expired: set `expires_at` where it matters),
/// with a seal of its key binding the database takes (fresh) but no key file made.
pub fn agent(id: &str, org: &str) -> AgentRecord {
    AgentRecord {
        id: crate::helpers::agent_id(id),
        org_id: crate::helpers::org_id(org),
        mode: KeyMode::Live,
        name: "n".into(),
        issuer_domain: agentid::domain::IssuerDomain::parse("example.com").unwrap(),
        description: String::new(),
        scopes: agentid::domain::Scopes::parse(&["read:x", "write:y"]).unwrap(),
        created_at: Millis(1),
        issued_at: Millis(1000),
        expires_at: Millis(2000),
        revoked_at: None,
        revocation_reason: None,
        status: None,
        jkt: None,
        jwk: None,
        key_mac: Some([7; 32]),
        key_sealed_at: Some(Millis::now()),
        verification_count: 0,
    }
}

fn entry(ledger: &Ledger, agent: impl AsRef<str>, result: VerifyResult) -> AuditEntry {
    AuditEntry {
        event: Event::Verification,
        ledger: ledger.clone(),
        agent_id: agent.as_ref().to_owned(),
        result,
        failure_reason: (result != VerifyResult::Valid).then(|| "why".to_owned()),
        latency_us: 7,
        requested_at: Millis::now(),
        revocations_seen: 0,
    }
}

#[actix_web::test]
async fn agents_round_trip_revoke_once_and_refuse_renewal_when_revoked() {
    let app = spawn_app().await;
    let s = &app.store;
    let org = app.org.org_id.clone();
    let a = agent("agt_01aaaaaaaaaaaaaaaaaaaaaaaa", &org);
    crate::helpers::insert_agent(&app.db.url, &a).await.unwrap();
    assert_eq!(s.get_agent(&a.id).await.unwrap(), Some(a.clone()));
    assert!(
        crate::helpers::insert_agent(&app.db.url, &a).await.is_err(),
        "ids are unique"
    );
    use agentid::store::{KeyBinding, NewBinding};
    let binding = |mac: &'static [u8; 32], read: &'static [u8; 32]| KeyBinding {
        read,
        new: Some(NewBinding {
            jkt: None,
            jwk: None,
            mac,
            sealed_at: Millis::now(),
        }),
    };
    let kept = |read: &'static [u8; 32]| KeyBinding { read, new: None };
    let renew = |until: i64, binding: KeyBinding<'static>| {
        let id = a.id.clone();
        async move {
            s.renew_token(&id, Millis(until - 1000), Millis(until), binding, None)
                .await
                .unwrap()
                .unwrap()
        }
    };
    let stored = || async { s.get_agent(&a.id).await.unwrap().unwrap() };
    assert!(renew(9000, binding(&[8; 32], &[7; 32])).await);
    // Tried again after it committed unseen, a renewal finds its own binding.
    assert!(renew(9000, binding(&[8; 32], &[7; 32])).await);
    // A renewal that read the binding before another renewal changed it changes nothing:
    // it would write back what that one replaced. One that keeps the binding, too.
    assert!(!renew(7000, binding(&[9; 32], &[7; 32])).await);
    assert!(!renew(7000, kept(&[7; 32])).await);
    let renewed = stored().await;
    assert_eq!(
        (renewed.expires_at, renewed.key_mac),
        (Millis(9000), Some([8; 32])),
        "the later renewal kept"
    );
    // One that keeps the binding it read renews the token only: the seal stays.
    assert!(renew(9500, kept(&[8; 32])).await);
    let kept_seal = stored().await;
    assert_eq!(
        (kept_seal.expires_at, kept_seal.key_mac, kept_seal.key_sealed_at),
        (Millis(9500), Some([8; 32]), renewed.key_sealed_at)
    );
    assert_eq!(s.revocations_after(0).await.unwrap(), Default::default());
    let (first, first_epoch) = s
        .revoke_agent(&a.id, Millis(10), Some("r1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.revoked_at, first.revocation_reason.as_deref(), first_epoch),
        (Some(Millis(10)), Some("r1"), Some(1)),
        "the first revocation moves the epoch from 0 to 1 and is stamped with it"
    );
    let (second, second_epoch) = s
        .revoke_agent(&a.id, Millis(20), Some("r2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            second.revoked_at,
            second.revocation_reason.as_deref(),
            second_epoch
        ),
        (Some(Millis(10)), Some("r1"), Some(1)),
        "a second revoke changes nothing, the epoch included"
    );
    let after = |epoch| s.revocations_after(epoch);
    assert_eq!(after(1).await.unwrap().epoch, 1);
    assert_eq!(
        after(0).await.unwrap().revoked,
        [agentid::store::Revocation {
            agent_id: a.id.clone(),
            reason: Some("r1".to_owned()),
            at: Millis(10),
            place: None,
        }]
    );
    assert!(after(1).await.unwrap().revoked.is_empty());
    assert_eq!(after(i64::MAX).await.unwrap().epoch, 1);
    assert!(!renew(40, binding(&[9; 32], &[8; 32])).await);
    assert_eq!(stored().await.expires_at, Millis(9500));
    assert!(s
        .revoke_agent(
            &crate::helpers::agent_id("agt_01zzzzzzzzzzzzzzzzzzzzzzzz"),
            Millis(1),
            None
        )
        .await
        .unwrap()
        .is_none());

    let b = agent("agt_01bbbbbbbbbbbbbbbbbbbbbbbb", &org);
    crate::helpers::insert_agent(&app.db.url, &b).await.unwrap();
    let listed: Vec<agentid::domain::AgentId> = s
        .list_agents(&crate::helpers::org_id(&org), KeyMode::Live, None, None)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(listed, [b.id.clone(), a.id.clone()], "newest first");
    assert!(s
        .list_agents(&crate::helpers::org_id(&org), KeyMode::Test, None, None)
        .await
        .unwrap()
        .is_empty());
    let scanned = s.scan_agents(a.id.as_str(), 10).await.unwrap();
    assert_eq!(scanned.len(), 1);
    assert_eq!(scanned[0].id, b.id);
}

#[actix_web::test]
async fn batches_chain_count_and_recheck_revocation_inside_the_transaction() {
    let app = spawn_app().await;
    let s = &app.store;
    let org = app.org.org_id.clone();
    let live = Ledger {
        org_id: org.clone(),
        mode: KeyMode::Live,
    };
    let test = Ledger {
        org_id: org.clone(),
        mode: KeyMode::Test,
    };
    let (a, b) = (
        agent("agt_01cccccccccccccccccccccccc", &org),
        agent("agt_01dddddddddddddddddddddddd", &org),
    );
    crate::helpers::insert_agent(&app.db.url, &a).await.unwrap();
    crate::helpers::insert_agent(&app.db.url, &b).await.unwrap();

    let batch1 = vec![
        entry(&live, &a.id, VerifyResult::Valid),
        entry(&test, &b.id, VerifyResult::Invalid),
        entry(&live, &a.id, VerifyResult::Expired),
    ];
    let recs = s.append_audit(batch1, sealer(&app)).await.into_result().unwrap();
    assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 1, 2]);

    // Revoked in the store but not yet known to the caller: the batch must say so.
    s.revoke_agent(&a.id, Millis(5), Some("stolen")).await.unwrap();
    let recs = s
        .append_audit(
            vec![
                entry(&live, &a.id, VerifyResult::Valid),
                entry(&live, &b.id, VerifyResult::Valid),
            ],
            sealer(&app),
        )
        .await
        .into_result()
        .unwrap();
    assert_eq!(recs[0].result, VerifyResult::Revoked);
    assert_eq!(recs[0].failure_reason.as_deref(), Some("agent revoked: stolen"));
    assert_eq!(recs[1].result, VerifyResult::Valid);
    assert_eq!(recs.iter().map(|r| r.seq).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(
        recs[0].prev_hash,
        s.read_log(LogQuery {
            ledger: &live,
            agent_id: None,
            result: None,
            before_seq: Some(3),
            limit: 1,
        })
        .await
        .unwrap()
        .records[0]
            .hash
    );

    let page = s
        .read_log(LogQuery {
            ledger: &live,
            agent_id: None,
            result: None,
            before_seq: None,
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!((page.total, page.has_more), (4, true));
    assert_eq!(page.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [4, 3]);
    let page = s
        .read_log(LogQuery {
            ledger: &live,
            agent_id: None,
            result: None,
            before_seq: Some(3),
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!((page.records.len(), page.has_more), (2, false));
    let mut totals = HashMap::new();
    for (agent_id, result) in [
        (Some(a.id.as_str()), None),
        (None, Some(VerifyResult::Revoked)),
        (Some(b.id.as_str()), Some(VerifyResult::Valid)),
    ] {
        let p = s
            .read_log(LogQuery {
                ledger: &live,
                agent_id,
                result,
                before_seq: None,
                limit: 200,
            })
            .await
            .unwrap();
        assert_eq!(p.total as usize, p.records.len());
        totals.insert((agent_id.map(str::to_owned), result), p.total);
    }
    assert_eq!(totals[&(Some(a.id.to_string()), None)], 3);
    assert_eq!(totals[&(None, Some(VerifyResult::Revoked))], 1);
    assert_eq!(totals[&(Some(b.id.to_string()), Some(VerifyResult::Valid))], 1);

    assert_eq!(s.get_agent(&a.id).await.unwrap().unwrap().verification_count, 3);
    assert_eq!(s.get_agent(&b.id).await.unwrap().unwrap().verification_count, 2);
    // Besides the service's own (where the grown issuer-domain list is recorded).
    let mut ledgers = s.ledgers().await.unwrap();
    ledgers.retain(|l| !l.is_service());
    ledgers.sort();
    assert_eq!(ledgers, [live, test]);
    app.log_holds().await;
}

#[actix_web::test]
async fn organizations_and_keys_round_trip() {
    let app = spawn_app().await;
    let s = &app.store;
    let mut org = s
        .get_org(&crate::helpers::org_id(&app.org.org_id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(org.plan, agentid::domain::Plan::Developer);
    // Custom limits are stored and read back on enterprise; on the other plans the table
    // is what is read, whatever the row holds.
    org.stored_limits.verify_per_minute = 7;
    assert!(s.update_org(&org).await.unwrap());
    let read = s.get_org(&org.id).await.unwrap().unwrap();
    assert_eq!(read.limits().verify_per_minute, 5_000);
    org.plan = agentid::domain::Plan::Enterprise;
    assert!(s.update_org(&org).await.unwrap());
    let read = s.get_org(&org.id).await.unwrap().unwrap();
    assert_eq!(read.limits(), org.stored_limits);
    let hash = agentid::engine::hash_key(&app.org.keys.publishable_test);
    let key = s.find_key(&hash).await.unwrap().unwrap();
    assert_eq!(
        (key.kind, key.mode, key.disabled),
        (agentid::domain::ApiKeyKind::Publishable, KeyMode::Test, false)
    );
    assert_eq!(key.org.id, org.id);
    assert!(s.find_key(&[0u8; 32]).await.unwrap().is_none());
    assert!(s.disable_key(&hash, Millis(1)).await.unwrap());
    assert!(s.find_key(&hash).await.unwrap().unwrap().disabled);
    assert!(!s.disable_key(&[0u8; 32], Millis(1)).await.unwrap());
    assert_eq!(s.count_orgs().await.unwrap(), 1);
}

/// The revocation epoch lets a batch skip its per-agent revocation look-ups, and only then:
/// an entry whose check had seen the store's epoch vouches that the caller's index held every
/// revocation up to it; one entry that had seen less makes the store look every valid entry's
/// agent up again.
#[actix_web::test]
async fn batches_recheck_revocation_only_when_a_check_could_have_missed_one() {
    let app = spawn_app().await;
    let s = &app.store;
    let org = app.org.org_id.clone();
    let live = Ledger {
        org_id: org.clone(),
        mode: KeyMode::Live,
    };
    let (a, b) = (
        agent("agt_01ffffffffffffffffffffffff", &org),
        agent("agt_01gggggggggggggggggggggggg", &org),
    );
    crate::helpers::insert_agent(&app.db.url, &a).await.unwrap();
    crate::helpers::insert_agent(&app.db.url, &b).await.unwrap();
    let (_, epoch) = s
        .revoke_agent(&a.id, Millis(5), Some("stolen"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(epoch, Some(1));
    let seen = |agent: &agentid::domain::AgentId, epoch| AuditEntry {
        event: Event::Verification,
        revocations_seen: epoch,
        ..entry(&live, agent, VerifyResult::Valid)
    };
    let results = |recs: Vec<agentid::domain::audit::AuditRecord>| {
        recs.into_iter().map(|r| r.result).collect::<Vec<_>>()
    };
    let recs = s
        .append_audit(vec![seen(&a.id, 1), seen(&b.id, 1)], sealer(&app))
        .await
        .into_result()
        .unwrap();
    assert_eq!(
        results(recs),
        [VerifyResult::Valid, VerifyResult::Valid],
        "taken as checked: not looked up"
    );
    let recs = s
        .append_audit(vec![seen(&a.id, 1), seen(&b.id, 0)], sealer(&app))
        .await
        .into_result()
        .unwrap();
    assert_eq!(results(recs), [VerifyResult::Revoked, VerifyResult::Valid]);
    // Another revocation moves the epoch past what the first entries had seen.
    s.revoke_agent(&b.id, Millis(6), None).await.unwrap();
    let recs = s
        .append_audit(vec![seen(&a.id, 1), seen(&b.id, 1)], sealer(&app))
        .await
        .into_result()
        .unwrap();
    assert_eq!(results(recs), [VerifyResult::Revoked, VerifyResult::Revoked]);
    let recs = s
        .append_audit(vec![seen(&a.id, 2), seen(&b.id, 2)], sealer(&app))
        .await
        .into_result()
        .unwrap();
    assert_eq!(results(recs), [VerifyResult::Valid, VerifyResult::Valid]);
}

#[actix_web::test]
async fn two_instances_appending_to_one_ledger_never_fork_the_chain() {
    let app = spawn_app().await;
    let other = agentid::store::connect(&app.db.url, &Default::default())
        .await
        .unwrap();
    let org = app.org.org_id.clone();
    let live = Ledger {
        org_id: org.clone(),
        mode: KeyMode::Live,
    };
    let a = agent("agt_01eeeeeeeeeeeeeeeeeeeeeeee", &org);
    crate::helpers::insert_agent(&app.db.url, &a).await.unwrap();
    // Alternate writers: each one's cached view of the head goes stale in turn.
    let mut seqs = Vec::new();
    for round in 0..6 {
        let store = if round % 2 == 0 { &app.store } else { &other };
        let recs = store
            .append_audit(
                vec![
                    entry(&live, &a.id, VerifyResult::Valid),
                    entry(&live, &a.id, VerifyResult::Valid),
                ],
                sealer(&app),
            )
            .await
            .into_result()
            .unwrap();
        seqs.extend(recs.iter().map(|r| r.seq));
    }
    assert_eq!(seqs, (1..=12).collect::<Vec<_>>());
    let report = app.log_holds().await;
    assert!(
        report
            .ledgers
            .iter()
            .filter(|l| !l.ledger.is_service())
            .all(|l| l.records == 12),
        "{:?}",
        report.ledgers
    );
    assert_eq!(
        app.store
            .get_agent(&a.id)
            .await
            .unwrap()
            .unwrap()
            .verification_count,
        12
    );
    // Batches of several blocks (300 records of one agent), by one writer three times (its
    // running totals for the agent known from its own last write), then by the other,
    // whose view went stale, and by the first again: every count stays exact.
    for (n, store) in [
        (312, &app.store),
        (612, &app.store),
        (912, &app.store),
        (1212, &other),
        (1512, &app.store),
    ] {
        let batch = (0..300)
            .map(|i| entry(&live, &a.id, VerifyResult::ALL[i % 4]))
            .collect();
        store
            .append_audit(batch, sealer(&app))
            .await
            .into_result()
            .unwrap();
        assert_eq!(
            store.get_agent(&a.id).await.unwrap().unwrap().verification_count,
            n
        );
        let total = |result| {
            let q = LogQuery {
                ledger: &live,
                agent_id: Some(a.id.as_str()),
                result,
                before_seq: None,
                limit: 1,
            };
            store.read_log(q)
        };
        assert_eq!(total(None).await.unwrap().total, n);
        let expired = total(Some(VerifyResult::Expired)).await.unwrap().total;
        assert_eq!(expired, (n - 12) / 4, "after {n}");
    }
    other.close().await;
}

/// Schema 3 stores the log as blocks. A database whose per-record log (schema 1 and 2, a
/// pre-release layout) holds records is refused with its tables unchanged, never opened as an
/// empty log that new records would fork; an empty one, as every new database has after
/// migration 1, is dropped.
#[actix_web::test]
async fn a_per_record_log_with_records_is_refused_and_an_empty_one_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let org = "org_01eeeeeeeeeeeeeeeeeeeeeeee";
    let zeros = if db.is_postgres() {
        format!("'\\x{}'::bytea", "00".repeat(32))
    } else {
        format!("X'{}'", "00".repeat(32))
    };
    let stmts = [
        format!("INSERT INTO orgs VALUES ('{org}', 'o', 'free', 100, 100, 3600, 1)"),
        format!(
            "INSERT INTO audit_log VALUES ('{org}', 'live', 1, 'log_1', '', 'invalid', NULL, 1, 1, {zeros}, {zeros})"
        ),
    ];
    // The per-record schema (migrations 1 and 2) only, then a record.
    db.at_schema(2, &stmts).await;
    let refused = agentid::store::connect(&db.url, &Default::default())
        .await
        .expect_err("a per-record log with records is refused");
    assert!(refused.to_string().contains("per-record audit log"), "{refused}");

    // A new database: migration 1's empty tables are gone once it is open.
    let fresh = spawn_app().await;
    let gone = fresh.raw_execute("SELECT 1 FROM audit_log").await;
    assert!(gone.is_err(), "audit_log is dropped");
}

/// A batch whose one ledger cannot be appended to (here its newest block is corrupt) still
/// commits the other ledgers' records: the store tries each ledger alone.
#[actix_web::test]
async fn one_ledgers_trouble_does_not_fail_the_other_ledgers_records() {
    let app = spawn_app().await;
    let s = &app.store;
    let good = Ledger {
        org_id: app.org.org_id.clone(),
        mode: KeyMode::Live,
    };
    let broken = Ledger {
        org_id: "org_broken".into(),
        mode: KeyMode::Live,
    };
    // A block whose last hash is 3 bytes long: no head can be read from it.
    let blob = if app.db.is_postgres() {
        "'\\x010203'::bytea"
    } else {
        "x'010203'"
    };
    let zeros = if app.db.is_postgres() {
        format!("'\\x{}'::bytea", "00".repeat(32))
    } else {
        format!("x'{}'", "00".repeat(32))
    };
    app.raw_execute(&format!(
        "INSERT INTO audit_blocks (org_id, mode, first_seq, last_seq, prev_hash, last_hash, results, \
         n_valid, n_invalid, n_expired, n_revoked, records, mac) \
         VALUES ('org_broken', 'live', 1, 1, {zeros}, {blob}, 1, 1, 0, 0, 0, {blob}, {zeros})"
    ))
    .await
    .unwrap();
    let batch = vec![
        entry(&good, "agt_01aaaaaaaaaaaaaaaaaaaaaaaa", VerifyResult::Valid),
        entry(&broken, "agt_01bbbbbbbbbbbbbbbbbbbbbbbb", VerifyResult::Valid),
        entry(&good, "agt_01aaaaaaaaaaaaaaaaaaaaaaaa", VerifyResult::Invalid),
    ];
    let appended = s.append_audit(batch, sealer(&app)).await;
    assert!(appended.failure.is_some());
    let [first, second, third] = appended.records.try_into().unwrap();
    assert_eq!(first.map(|r| r.seq), Some(1));
    assert!(second.is_none(), "the broken ledger's record is not written");
    assert_eq!(third.map(|r| (r.seq, r.result)), Some((2, VerifyResult::Invalid)));
}

/// A PostgreSQL that cannot be reached is named (host, port, database) with why, not
/// reported as a pool that timed out.
#[actix_web::test]
async fn an_unreachable_postgres_is_named_with_why() {
    let opts = agentid::store::StoreOptions::default();
    let err = agentid::store::connect("postgres://postgres@127.0.0.1:1/test", &opts)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("127.0.0.1:1/test"), "{err}");
    assert!(err.contains("connection refused"), "{err}");
    if let Some(admin) = crate::helpers::postgres_admin_url() {
        let base = admin.rsplit_once('/').unwrap().0;
        let err = agentid::store::connect(&format!("{base}/agentid_no_such_database"), &opts)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such database"), "{err}");
    }
}

/// Migration 13 gives each organization the issuer domains its agents used where no other
/// organization used the name (that name alone, `existing`); a name several used goes to
/// none of them, and `domain list` says so.
#[actix_web::test]
async fn names_in_use_before_proofs_go_to_their_only_user() {
    use agentid::store::migrate;
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let orgs = [
        "org_01aaaaaaaaaaaaaaaaaaaaaaaa",
        "org_01bbbbbbbbbbbbbbbbbbbbbbbb",
        "org_01cccccccccccccccccccccc",
    ];
    let mut stmts: Vec<String> = orgs
        .iter()
        .map(|o| {
            format!(
                "INSERT INTO orgs (id, name, plan, verify_limit, other_limit, max_expiry_seconds, created_at) \
                 VALUES ('{o}', '{o}', 'free', 100, 100, 3600, 1)"
            )
        })
        .collect();
    for (i, (org, mode, domain)) in [
        (0, "live", "solo.example"),
        (0, "test", "solo.example"),
        (1, "live", "shared.example"),
        (2, "live", "shared.example"),
        (1, "live", "bee.example"),
    ]
    .into_iter()
    .enumerate()
    {
        stmts.push(format!(
            "INSERT INTO agents (id, org_id, mode, name, issuer_domain, description, scopes, created_at, \
             issued_at, expires_at) VALUES ('agt_01dddddddddddddddddddddd{i:02}', '{}', '{mode}', 'n', \
             '{domain}', '', '[\"read:x\"]', {}, 1, 2)",
            orgs[org],
            100 + i
        ));
    }
    macro_rules! before_proofs {
        ($pool:expr, $set:expr) => {{
            let pool = $pool;
            migrate::migrator(&$set[..12])
                .await
                .unwrap()
                .run(&pool)
                .await
                .unwrap();
            for s in &stmts {
                sqlx::query(s).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }};
    }
    if db.is_postgres() {
        before_proofs!(sqlx::PgPool::connect(&db.url).await.unwrap(), migrate::POSTGRES);
    } else {
        let opts = db.url.parse::<sqlx::sqlite::SqliteConnectOptions>().unwrap();
        let pool = sqlx::SqlitePool::connect_with(opts.create_if_missing(true))
            .await
            .unwrap();
        before_proofs!(pool, migrate::SQLITE);
    }
    let store = agentid::store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    // Any key file: what the migration carried over is vouched for by its place.
    let keys = agentid::keys::KeyRing::from_signing_key(ed25519_dalek::SigningKey::from_bytes(&[9; 32]));
    let held: Vec<(String, String, &str)> = store
        .holdings(&Rules::new(&keys), None)
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.domain, h.org_id, h.method.as_str()))
        .collect();
    assert_eq!(
        held,
        [
            ("bee.example".to_owned(), orgs[1].to_owned(), "existing"),
            ("solo.example".to_owned(), orgs[0].to_owned(), "existing"),
        ]
    );
    let listed = agentid::engine::grants::list(&store, &keys, None).await.unwrap();
    let shared = listed.iter().find(|l| l.domain == "shared.example").unwrap();
    assert_eq!(
        (shared.status, shared.org_ids.clone()),
        ("unverified", vec![orgs[1].to_owned(), orgs[2].to_owned()])
    );
    // That name alone: nothing below it.
    let over = store
        .holdings_over(&Rules::new(&keys), "eu.solo.example")
        .await
        .unwrap();
    assert!(agentid::domain::holding::may_issue(orgs[0], "eu.solo.example", &over).is_err());
    assert!(agentid::domain::holding::may_issue(
        orgs[0],
        "solo.example",
        &store
            .holdings_over(&Rules::new(&keys), "solo.example")
            .await
            .unwrap()
    )
    .is_ok());
}

/// Who gets a revocation's Shared Signals event, decided in one statement both backends run:
/// the agent's organization's and mode's streams that carry revocations, enabled or paused,
/// with no subjects or the agent among them; once, at the revocation, not again.
#[actix_web::test]
async fn a_revocation_reaches_exactly_the_streams_that_cover_it() {
    use agentid::store::StreamRecord;
    let app = spawn_app().await;
    let s = &app.store;
    let org = app.org.org_id.clone();
    let other = agentid::engine::admin::create_org(
        s,
        app.engine.keys(),
        "other",
        agentid::domain::Plan::Free,
        agentid::domain::Plan::Free.default_limits().unwrap(),
    )
    .await
    .unwrap()
    .org_id;
    let stream = |id: &str, org: &str, mode: KeyMode, status: &str, revocations: bool| StreamRecord {
        id: crate::helpers::stream_id(id),
        org_id: crate::helpers::org_id(org),
        mode,
        aud: "a".into(),
        method: "urn:ietf:rfc:8936".into(),
        endpoint_url: None,
        poll_token_hash: None,
        events_requested: Vec::new(),
        revocations,
        description: None,
        status: status.into(),
        created_at: Millis(1),
    };
    let streams = [
        ("ssf_all", org.as_str(), KeyMode::Live, "enabled", true, true),
        ("ssf_paused", org.as_str(), KeyMode::Live, "paused", true, true),
        (
            "ssf_disabled",
            org.as_str(),
            KeyMode::Live,
            "disabled",
            true,
            false,
        ),
        (
            "ssf_no_revocations",
            org.as_str(),
            KeyMode::Live,
            "enabled",
            false,
            false,
        ),
        (
            "ssf_subject_x",
            org.as_str(),
            KeyMode::Live,
            "enabled",
            true,
            true,
        ),
        (
            "ssf_subject_y",
            org.as_str(),
            KeyMode::Live,
            "enabled",
            true,
            false,
        ),
        (
            "ssf_test_mode",
            org.as_str(),
            KeyMode::Test,
            "enabled",
            true,
            false,
        ),
        (
            "ssf_other_org",
            other.as_str(),
            KeyMode::Live,
            "enabled",
            true,
            false,
        ),
    ];
    for (id, o, mode, status, revocations, _) in &streams {
        assert!(s
            .insert_stream(&stream(id, o, *mode, status, *revocations), 10)
            .await
            .unwrap());
    }
    let x = agent("agt_01xxxxxxxxxxxxxxxxxxxxxxxx", &org);
    crate::helpers::insert_agent(&app.db.url, &x).await.unwrap();
    s.add_subject(&crate::helpers::stream_id("ssf_subject_x"), &x.id, 10)
        .await
        .unwrap();
    s.add_subject(
        &crate::helpers::stream_id("ssf_subject_y"),
        &crate::helpers::agent_id("agt_01yyyyyyyyyyyyyyyyyyyyyyyy"),
        10,
    )
    .await
    .unwrap();
    s.revoke_agent(&x.id, Millis(5000), Some("why")).await.unwrap();
    s.revoke_agent(&x.id, Millis(6000), Some("again")).await.unwrap();
    for (id, _, _, _, _, gets) in &streams {
        let events = s
            .pending_events(&crate::helpers::stream_id(id), 10)
            .await
            .unwrap();
        assert_eq!(events.len(), usize::from(*gets), "{id}: {events:?}");
        for e in events {
            assert_eq!(
                (
                    e.kind.as_str(),
                    e.agent_id.as_deref(),
                    e.reason.as_deref(),
                    e.event_at
                ),
                ("session-revoked", Some(x.id.as_str()), Some("why"), Millis(5000))
            );
        }
    }
}

/// A client assertion is taken once, on either backend, until it is forgotten once expired.
#[actix_web::test]
async fn a_client_assertion_is_used_once_until_forgotten() {
    let app = spawn_app().await;
    let s = &app.store;
    assert!(s.use_assertion("a", Millis(5_000)).await.unwrap());
    assert!(!s.use_assertion("a", Millis(5_000)).await.unwrap(), "a replay");
    assert!(s.use_assertion("b", Millis(9_000)).await.unwrap());
    // Forgetting keeps what could still pass.
    s.forget_assertions(Millis(5_000)).await.unwrap();
    assert!(!s.use_assertion("a", Millis(5_000)).await.unwrap());
    s.forget_assertions(Millis(5_001)).await.unwrap();
    assert!(
        s.use_assertion("a", Millis(5_000)).await.unwrap(),
        "forgotten once expired"
    );
    assert!(!s.use_assertion("b", Millis(9_000)).await.unwrap());
}
