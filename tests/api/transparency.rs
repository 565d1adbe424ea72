//! The audit log as a transparency log: signed checkpoints, proofs checked by a verifier
//! written here from RFC 9162's definitions (not the service's own), the detection matrix of
//! `audit verify`, the witness, and the database's own refusals.

use std::time::Duration;

use agentid::domain::audit::AuditRecord;
use agentid::domain::{KeyMode, Ledger};
use agentid::engine::transparency::check as logcheck;
use agentid::store::block;
use agentid::tlog::note::GivenNote;
use agentid::tlog::note::LogVerifier;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ed25519_dalek::{Signature, VerifyingKey};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use sha2::{Digest, Sha256};

use crate::helpers::{blob, spawn_app, spawn_app_with, Options, TestApp};

type H = [u8; 32];

// ---- An RFC 9162 §2.1 verifier, straight from the definitions --------------------------------

fn sha(parts: &[&[u8]]) -> H {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

fn leaf(record_hash: &H) -> H {
    sha(&[&[0], record_hash])
}

fn node(l: &H, r: &H) -> H {
    sha(&[&[1], l, r])
}

/// The largest power of two smaller than n (n > 1).
fn k_of(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// MTH(D[n]) of record hashes.
fn mth(d: &[H]) -> H {
    match d.len() {
        0 => sha(&[]),
        1 => leaf(&d[0]),
        n => {
            let k = k_of(n);
            node(&mth(&d[..k]), &mth(&d[k..]))
        }
    }
}

/// The root an inclusion proof leads to, by PATH's recursion run backwards: the proof's last
/// hash is the sibling at the top.
fn root_from_path(m: usize, n: usize, leaf_hash: H, proof: &[H]) -> Option<H> {
    if n == 1 {
        return proof.is_empty().then_some(leaf_hash);
    }
    let (top, rest) = proof.split_last()?;
    let k = k_of(n);
    Some(if m < k {
        node(&root_from_path(m, k, leaf_hash, rest)?, top)
    } else {
        node(top, &root_from_path(m - k, n - k, leaf_hash, rest)?)
    })
}

/// The (old, new) roots a consistency proof leads to, by SUBPROOF's recursion run backwards.
fn roots_from_subproof(m: usize, n: usize, old_root: H, proof: &[H], whole: bool) -> Option<(H, H)> {
    if m == n {
        if whole {
            return proof.is_empty().then_some((old_root, old_root));
        }
        let (h, rest) = proof.split_last()?;
        return rest.is_empty().then_some((*h, *h));
    }
    let (top, rest) = proof.split_last()?;
    let k = k_of(n);
    if m <= k {
        let (o, new) = roots_from_subproof(m, k, old_root, rest, whole)?;
        Some((o, node(&new, top)))
    } else {
        let (o, new) = roots_from_subproof(m - k, n - k, old_root, rest, false)?;
        Some((node(top, &o), node(top, &new)))
    }
}

fn unhex(s: &str) -> H {
    assert_eq!(s.len(), 64, "{s}");
    let mut out = [0u8; 32];
    for i in 0..32 {
        out[i] = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

/// A C2SP signed note checked by hand: the key line's parts, the key hash, the signature over
/// the text. Returns (origin, size, root).
fn open_note(key_line: &str, note: &str) -> (String, usize, H) {
    let parts: Vec<&str> = key_line.trim().splitn(3, '+').collect();
    let (name, hash_hex, key) = (parts[0], parts[1], STANDARD.decode(parts[2]).unwrap());
    assert_eq!(key[0], 1, "Ed25519 key type");
    let id = sha(&[name.as_bytes(), b"\n", &key]);
    assert_eq!(hash_hex, hex(&id[..4]));
    let pk = VerifyingKey::from_bytes(&key[1..].try_into().unwrap()).unwrap();
    let (text, sigs) = note
        .split_once("\n\n")
        .expect("a blank line before the signatures");
    let text = format!("{text}\n");
    let sig_line = sigs.lines().next().unwrap();
    let rest = sig_line.strip_prefix("\u{2014} ").expect("em dash");
    let (sig_name, blob) = rest.split_once(' ').unwrap();
    assert_eq!(sig_name, name);
    let blob = STANDARD.decode(blob).unwrap();
    assert_eq!(blob.len(), 68);
    assert_eq!(blob[..4], id[..4]);
    pk.verify_strict(text.as_bytes(), &Signature::from_slice(&blob[4..]).unwrap())
        .expect("the checkpoint's signature verifies");
    let lines: Vec<&str> = text.lines().collect();
    (
        lines[0].to_owned(),
        lines[1].parse().unwrap(),
        STANDARD.decode(lines[2]).unwrap().try_into().unwrap(),
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---- Helpers -----------------------------------------------------------------------------------

/// Makes `n` verifications in the org's live ledger (two agents), as the org's receiver.
async fn fill(app: &TestApp, n: usize) {
    let (_, a) = app.agent().await;
    let (_, b) = app.agent().await;
    for i in 0..n {
        let res = app.verify_as_receiver(if i % 3 == 0 { &b } else { &a }).await;
        assert_eq!(res.status, 200, "{}", res.text());
    }
}

/// Waits for the caller's ledger to be checkpointed at `size` records or more; its note.
async fn checkpoint_at(app: &TestApp, size: usize) -> String {
    for _ in 0..200 {
        let note = app.get("/v1/log/checkpoint", Some(app.secret())).await.text();
        let n: usize = note.lines().nth(1).unwrap().parse().unwrap();
        if n >= size {
            return note;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no checkpoint of {size} records came");
}

/// Every record hash of the caller's ledger, seq 1 first.
async fn record_hashes(app: &TestApp) -> Vec<H> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = app.log(&format!("?limit=200{cursor}")).await;
        for r in page["data"].as_array().unwrap() {
            out.push((r["seq"].as_u64().unwrap(), unhex(r["hash"].as_str().unwrap())));
        }
        match page["pagination"]["cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    out.sort();
    for (i, (seq, _)) in out.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "seq runs 1, 2, 3 …");
    }
    out.into_iter().map(|(_, h)| h).collect()
}

fn live(app: &TestApp) -> Ledger {
    Ledger {
        org_id: app.org.org_id.clone(),
        mode: KeyMode::Live,
    }
}

async fn verifier(app: &TestApp) -> LogVerifier {
    LogVerifier::parse(&app.get("/.well-known/log-key", None).await.text()).unwrap()
}

async fn tamper(app: &TestApp, sql: &str) {
    crate::helpers::tamper(app, sql).await
}

/// Replaces the records of a block row (triggers off), as bytes.
async fn rewrite_block(app: &TestApp, first_seq: i64, records: &[AuditRecord], prev_hash: &H) {
    let refs: Vec<&AuditRecord> = records.iter().collect();
    let bytes = block::encode(&refs);
    let last = records.last().unwrap().hash;
    tamper(
        app,
        &format!(
            "UPDATE audit_blocks SET records = {}, prev_hash = {}, last_hash = {} \
             WHERE org_id = '{}' AND mode = 'live' AND first_seq = {first_seq}",
            blob(app, &bytes),
            blob(app, prev_hash),
            blob(app, &last),
            app.org.org_id
        ),
    )
    .await;
}

/// Every block of the org's live ledger with its records.
async fn blocks(app: &TestApp) -> Vec<(i64, Vec<AuditRecord>)> {
    let ledger = live(app);
    let rows = app.store.read_blocks(&ledger, 0, 10_000).await.unwrap();
    rows.into_iter()
        .map(|b| (b.seal.first_seq, b.records.unwrap()))
        .collect()
}

async fn audit(app: &TestApp, given: &[String]) -> logcheck::Report {
    let v = verifier(app).await;
    let given: Vec<GivenNote> = given
        .iter()
        .map(|n| GivenNote {
            source: "saved".into(),
            note: n.clone(),
        })
        .collect();
    let keys = agentid::keys::KeyRing::load(&app.config.signing_key_file).unwrap();
    logcheck::check(
        &app.store,
        &v,
        keys.as_ref(),
        &given,
        std::time::Duration::from_secs(3600),
    )
    .await
    .unwrap()
}

fn failures(r: &logcheck::Report) -> String {
    r.failures.iter().map(|f| format!("{f}\n")).collect()
}

// ---- Checkpoints and proofs --------------------------------------------------------------------

#[actix_web::test]
async fn checkpoints_are_signed_notes_over_the_records_tree() {
    let app = spawn_app().await;
    fill(&app, 21).await;
    let key = app.get("/.well-known/log-key", None).await;
    assert_eq!(key.status, 200);
    assert!(key.header("content-type").unwrap().starts_with("text/plain"));
    let note = checkpoint_at(&app, 21).await;
    let res = app.get("/v1/log/checkpoint", Some(app.secret())).await;
    assert!(res.header("content-type").unwrap().starts_with("text/plain"));
    let (origin, size, root) = open_note(&key.text(), &note);
    let host = agentid::app::host_of(&app.base);
    assert_eq!(origin, format!("{host}/agentid/{}/live", app.org.org_id));
    assert!(key.text().starts_with(&format!("{host}/agentid+")));
    let hashes = record_hashes(&app).await;
    assert_eq!(
        mth(&hashes[..size]),
        root,
        "the root is RFC 9162's MTH of the record hashes"
    );

    // The test ledger is its own: no records yet, the empty tree's checkpoint.
    let keys = &app.org.keys;
    let empty = app
        .get("/v1/log/checkpoint", Some(&keys.secret_test))
        .await
        .text();
    let (origin, size, root) = open_note(&key.text(), &empty);
    assert_eq!((origin.ends_with("/test"), size, root), (true, 0, sha(&[])));

    // Secret keys only.
    app.get("/v1/log/checkpoint", Some(&keys.publishable_live))
        .await
        .assert_error(403, "FORBIDDEN");
    app.get("/v1/log/checkpoint", None)
        .await
        .assert_error(401, "UNAUTHORIZED");
}

#[actix_web::test]
async fn proofs_verify_with_an_independent_verifier_for_random_sizes() {
    let app = spawn_app_with(Options::unlimited()).await;
    fill(&app, 300).await;
    let note = checkpoint_at(&app, 300).await;
    let key = app.get("/.well-known/log-key", None).await.text();
    let (_, latest, _) = open_note(&key, &note);
    let hashes = record_hashes(&app).await;
    let secret = app.secret().to_owned();

    // Fixed seed: the same cases in every run.
    let mut runner = TestRunner::deterministic();
    let pairs = (1..=latest).prop_flat_map(|size| (1..=size, proptest::strategy::Just(size)));
    let mut cases: Vec<(usize, usize)> = (0..60)
        .map(|_| pairs.new_tree(&mut runner).unwrap().current())
        .collect();
    cases.extend([
        (1, 1),
        (1, latest),
        (latest, latest),
        (16, 16),
        (17, 32),
        (256, 300),
    ]);
    for (a, b) in cases {
        let p = app
            .get(
                &format!("/v1/log/proof/inclusion?seq={a}&tree_size={b}"),
                Some(&secret),
            )
            .await;
        assert_eq!(p.status, 200, "{}", p.text());
        let p = p.json();
        assert_eq!(
            (p["seq"].as_u64(), p["tree_size"].as_u64()),
            (Some(a as u64), Some(b as u64))
        );
        let record = unhex(p["hash"].as_str().unwrap());
        assert_eq!(record, hashes[a - 1]);
        let proof: Vec<H> = p["proof"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| unhex(h.as_str().unwrap()))
            .collect();
        let root = root_from_path(a - 1, b, leaf(&record), &proof);
        assert_eq!(root, Some(mth(&hashes[..b])), "inclusion of {a} in {b}");

        let c = app
            .get(
                &format!("/v1/log/proof/consistency?from={a}&to={b}"),
                Some(&secret),
            )
            .await;
        assert_eq!(c.status, 200, "{}", c.text());
        let c = c.json();
        assert_eq!(
            (c["from"].as_u64(), c["to"].as_u64()),
            (Some(a as u64), Some(b as u64))
        );
        let proof: Vec<H> = c["proof"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| unhex(h.as_str().unwrap()))
            .collect();
        let old = mth(&hashes[..a]);
        // RFC 9162: a proof from a power-of-two size leaves out the old root itself.
        let got = roots_from_subproof(a, b, old, &proof, true);
        assert_eq!(got, Some((old, mth(&hashes[..b]))), "consistency {a} → {b}");
        // And the service's own verifier agrees.
        agentid::tlog::tree::verify_consistency(a as u64, b as u64, &old, &mth(&hashes[..b]), &proof)
            .unwrap();
    }
}

#[actix_web::test]
async fn proofs_out_of_range_or_malformed_are_validation_errors() {
    let app = spawn_app().await;
    fill(&app, 5).await;
    checkpoint_at(&app, 5).await;
    let s = app.secret().to_owned();
    for q in [
        "inclusion?seq=0&tree_size=3",
        "inclusion?seq=4&tree_size=3",
        "inclusion?seq=1&tree_size=99",
        "inclusion?seq=1",
        "inclusion?seq=x&tree_size=3",
        "inclusion?seq=-1&tree_size=3",
        "consistency?from=0&to=3",
        "consistency?from=4&to=3",
        "consistency?from=1&to=99",
        "consistency?to=3",
        "consistency?from=1&to=99999999999999999999999",
    ] {
        app.get(&format!("/v1/log/proof/{q}"), Some(&s))
            .await
            .assert_error(400, "VALIDATION_ERROR");
    }
    let pk = app.org.keys.publishable_live.clone();
    app.get("/v1/log/proof/inclusion?seq=1&tree_size=1", Some(&pk))
        .await
        .assert_error(403, "FORBIDDEN");
    // A ledger with no checkpoint yet has no proofs.
    app.get(
        "/v1/log/proof/consistency?from=1&to=1",
        Some(&app.org.keys.secret_test),
    )
    .await
    .assert_error(400, "VALIDATION_ERROR");
}

#[actix_web::test]
async fn log_records_carry_their_seq_and_hash() {
    let app = spawn_app().await;
    fill(&app, 4).await;
    let page = app.log("?limit=2").await;
    let data = page["data"].as_array().unwrap();
    assert_eq!(data[0]["seq"], 4);
    assert_eq!(data[1]["seq"], 3);
    for r in data {
        let h = r["hash"].as_str().unwrap();
        assert!(
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
    let hashes = record_hashes(&app).await;
    let stored: Vec<H> = blocks(&app)
        .await
        .into_iter()
        .flat_map(|(_, recs)| recs.into_iter().map(|r| r.hash))
        .collect();
    assert_eq!(hashes, stored);
}

// ---- audit verify: the detection matrix ------------------------------------------------------

/// A ledger with records and a checkpoint saved outside (as a witness keeps it), another
/// ledger beside it, and a clean audit to start from.
async fn logged_app() -> (TestApp, String) {
    let app = spawn_app().await;
    fill(&app, 30).await;
    app.verify("not-a-token").await; // the service ledger
    let saved = checkpoint_at(&app, 30).await;
    let r = audit(&app, std::slice::from_ref(&saved)).await;
    assert!(r.ok(), "{}", failures(&r));
    assert!(r
        .ledgers
        .iter()
        .any(|l| l.ledger == live(&app) && l.records == 30 && l.checkpoints >= 2));
    (app, saved)
}

fn caught(r: &logcheck::Report, ledger: &Ledger, seq: Option<u64>, words: &str) {
    assert!(
        r.failures
            .iter()
            .any(|f| &f.ledger == ledger && (seq.is_none() || f.seq == seq) && f.what.contains(words)),
        "expected a failure of {ledger} at {seq:?} saying {words:?}; got:\n{}",
        failures(r)
    );
}

/// A forged token once recorded under the name it gave, in the shape agent ids were read in
/// before they were read as ULIDs (a first letter past 7, an i, l, o or u): the log that holds
/// it, with its per-agent rows, still checks.
#[actix_web::test]
async fn records_of_names_in_the_earlier_agent_id_shape_still_check() {
    use agentid::domain::audit::{AuditEntry, Event};
    let app = spawn_app().await;
    let keys = agentid::keys::KeyRing::load(&app.config.signing_key_file)
        .unwrap()
        .unwrap();
    let sealer: agentid::store::BlockSealer = std::sync::Arc::new(keys.audit_block_sealer());
    for name in ["agt_8zzzzzzzzzzzzzzzzzzzzzzzzz", "agt_01jdiloux00000000000000000"] {
        assert!(agentid::domain::AgentId::parse(name).is_none(), "{name}");
        let entry = AuditEntry {
            event: Event::Verification,
            ledger: Ledger::service(),
            agent_id: name.to_owned(),
            result: agentid::domain::VerifyResult::Invalid,
            failure_reason: Some("signature does not verify".into()),
            latency_us: 7,
            requested_at: agentid::domain::Millis::now(),
            revocations_seen: 0,
        };
        app.store
            .append_audit(vec![entry], sealer.clone())
            .await
            .into_result()
            .unwrap();
    }
    let r = audit(&app, &[]).await;
    assert!(r.ok(), "{}", failures(&r));
}

#[actix_web::test]
async fn an_edited_record_is_caught_with_and_without_checkpoints() {
    let (app, saved) = logged_app().await;
    let (first, mut recs) = blocks(&app).await.into_iter().nth(9).unwrap();
    let prev = recs[0].prev_hash;
    recs[0].result = agentid::domain::VerifyResult::Invalid; // the hash stays what it was
    rewrite_block(&app, first, &recs, &prev).await;
    let seq = Some(recs[0].seq as u64);
    caught(&audit(&app, &[]).await, &live(&app), seq, "was edited");
    caught(&audit(&app, &[saved]).await, &live(&app), seq, "was edited");
}

#[actix_web::test]
async fn a_deleted_middle_block_is_caught_with_and_without_checkpoints() {
    let (app, saved) = logged_app().await;
    let (first, _) = blocks(&app).await.into_iter().nth(12).unwrap();
    let org = &app.org.org_id;
    tamper(
        &app,
        &format!(
            "DELETE FROM audit_blocks WHERE org_id = '{org}' AND first_seq = {first}; \
             DELETE FROM audit_block_agents WHERE org_id = '{org}' AND first_seq = {first};"
        ),
    )
    .await;
    caught(
        &audit(&app, &[]).await,
        &live(&app),
        Some(first as u64),
        "missing",
    );
    let r = audit(&app, &[saved]).await;
    caught(&r, &live(&app), Some(first as u64), "missing");
    caught(&r, &live(&app), None, "cannot be recomputed");
}

#[actix_web::test]
async fn a_cut_tail_is_caught_by_a_saved_checkpoint() {
    let (app, saved) = logged_app().await;
    let org = &app.org.org_id;
    tamper(
        &app,
        &format!(
            "DELETE FROM audit_blocks WHERE org_id = '{org}' AND first_seq > 20; \
             DELETE FROM audit_block_agents WHERE org_id = '{org}' AND first_seq > 20; \
             DELETE FROM audit_checkpoints WHERE org_id = '{org}' AND tree_size > 20; \
             DELETE FROM audit_tree_nodes WHERE org_id = '{org}';"
        ),
    )
    .await;
    // The stored checkpoints were cut with it: the database alone looks whole.
    let alone = audit(&app, &[]).await;
    assert!(
        !alone.failures.iter().any(|f| f.what.contains("cut off")),
        "{}",
        failures(&alone)
    );
    caught(&audit(&app, &[saved]).await, &live(&app), Some(21), "cut off");
}

#[actix_web::test]
async fn a_deleted_ledger_is_caught_by_a_saved_checkpoint() {
    let (app, saved) = logged_app().await;
    let org = &app.org.org_id;
    let mut sql = String::new();
    for t in [
        "audit_blocks",
        "audit_block_agents",
        "audit_checkpoints",
        "audit_tree_nodes",
    ] {
        sql.push_str(&format!("DELETE FROM {t} WHERE org_id = '{org}';"));
    }
    tamper(&app, &sql).await;
    let r = audit(&app, &[saved]).await;
    caught(&r, &live(&app), None, "the ledger is gone");
}

#[actix_web::test]
async fn a_rewritten_and_rehashed_chain_is_caught_by_checkpoints() {
    let (app, saved) = logged_app().await;
    // Change one record's latency (nothing derived depends on it), re-hash it and every
    // record after it, and write the chain back: every link and hash holds again.
    let mut prev = agentid::domain::audit::GENESIS;
    for (i, (first, recs)) in blocks(&app).await.into_iter().enumerate() {
        let block_prev = prev;
        let mut new = Vec::new();
        for mut r in recs {
            if i == 5 {
                r.latency_us += 1_000_000;
            }
            r.prev_hash = prev;
            r.hash = r.compute_hash();
            prev = r.hash;
            new.push(r);
        }
        if i >= 5 {
            rewrite_block(&app, first, &new, &block_prev).await;
        }
    }
    // The chain itself holds: what catches it is the tree, through the stored checkpoints
    // (their notes are signed) and a saved one.
    let r = audit(&app, &[]).await;
    assert!(
        r.failures
            .iter()
            .all(|f| !f.what.contains("chain is broken") && !f.what.contains("was edited")),
        "{}",
        failures(&r)
    );
    caught(&r, &live(&app), Some(30), "another root");
    caught(
        &audit(&app, &[saved]).await,
        &live(&app),
        Some(30),
        "another root",
    );
}

#[actix_web::test]
async fn edited_derived_columns_are_caught_with_and_without_checkpoints() {
    let (app, saved) = logged_app().await;
    let org = &app.org.org_id;
    let before = app.log("?limit=1").await["pagination"]["total"].clone();
    let (last, _) = blocks(&app).await.into_iter().last().unwrap();
    tamper(
        &app,
        &format!(
            "UPDATE audit_blocks SET n_valid = n_valid + 100 WHERE org_id = '{org}' AND first_seq = {last}"
        ),
    )
    .await;
    let after = app.log("?limit=1").await["pagination"]["total"].clone();
    assert_ne!(before, after, "the edit changed what GET /v1/log answers");
    caught(
        &audit(&app, &[]).await,
        &live(&app),
        Some(last as u64),
        "running totals",
    );
    tamper(
        &app,
        &format!("UPDATE audit_block_agents SET results = 8 WHERE org_id = '{org}' AND first_seq = 3"),
    )
    .await;
    let r = audit(&app, &[saved]).await;
    caught(&r, &live(&app), Some(3), "per-agent rows");
}

#[actix_web::test]
async fn audit_verify_goes_on_past_an_unreadable_block_and_exits_non_zero() {
    let (app, saved) = logged_app().await;
    let org = &app.org.org_id;
    tamper(
        &app,
        &format!(
            "UPDATE audit_blocks SET records = {} WHERE org_id = '{org}' AND first_seq = 7",
            blob(&app, &[2, 0xff])
        ),
    )
    .await;
    let r = audit(&app, std::slice::from_ref(&saved)).await;
    caught(&r, &live(&app), Some(7), "unreadable block");
    // The other ledger was checked too.
    assert!(r.ledgers.iter().any(|l| l.ledger.is_service() && l.records >= 1));

    // The command line: each failure with its ledger and seq, and a non-zero exit.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("saved.note");
    std::fs::write(&file, &saved).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["audit", "verify", "--database-url", &app.db.url, "--checkpoints"])
        .arg(&file)
        .arg("--signing-key-file")
        .arg(&app.config.signing_key_file)
        .args(["--public-url", &app.base])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("FAIL    {org}/live seq 7: unreadable block")),
        "{stdout}"
    );
    assert!(stdout.contains("ok      service/live"), "{stdout}");
}

// ---- The witness ---------------------------------------------------------------------------------

async fn witness(app: &TestApp, state: &std::path::Path) -> std::process::Output {
    crate::helpers::witness(app, state, &[]).await
}

#[actix_web::test]
async fn the_witness_catches_a_cut_tail_even_with_the_stored_checkpoints_cut_too() {
    let (app, _) = logged_app().await;
    let state = tempfile::tempdir().unwrap();
    let out = witness(&app, state.path()).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fill(&app, 5).await;
    checkpoint_at(&app, 35).await;
    let out = witness(&app, state.path()).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("extends the 30 seen before"));

    // Cut the tail and every trace of it, then restart so that the service knows only what
    // is left.
    let org = app.org.org_id.clone();
    tamper(
        &app,
        &format!(
            "DELETE FROM audit_blocks WHERE org_id = '{org}' AND first_seq > 25; \
             DELETE FROM audit_block_agents WHERE org_id = '{org}' AND first_seq > 25; \
             DELETE FROM audit_checkpoints WHERE org_id = '{org}' AND tree_size > 25;"
        ),
    )
    .await;
    // Subtree hashes past the latest checkpoint left (16 leaves each at these sizes).
    let left = app
        .store
        .latest_checkpoints(&live(&app), u64::MAX, 1)
        .await
        .unwrap()
        .first()
        .map_or(0, |c| c.size);
    tamper(
        &app,
        &format!(
            "DELETE FROM audit_tree_nodes WHERE org_id = '{org}' AND idx >= {}",
            left / 16
        ),
    )
    .await;
    let app = app.restart().await;
    let out = witness(&app, state.path()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the log shrank"), "{err}");

    // GrownLedgers past the saved size again: a different tree, which cannot be proved to extend it.
    fill(&app, 15).await;
    checkpoint_at(&app, 36).await;
    let out = witness(&app, state.path()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("did not only grow") || err.contains("cannot prove"),
        "{err}"
    );
}

#[actix_web::test]
async fn the_witness_refuses_a_log_key_other_than_the_pinned_one() {
    let app = spawn_app().await;
    fill(&app, 2).await;
    checkpoint_at(&app, 2).await;
    let state = tempfile::tempdir().unwrap();
    assert!(witness(&app, state.path()).await.status.success());
    let other = agentid::tlog::note::LogKey::derive("elsewhere/agentid", &[1; 32]);
    std::fs::write(state.path().join("log-key"), format!("{}\n", other.verifier())).unwrap();
    let out = witness(&app, state.path()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not verify"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["audit", "witness", "--url", "http://127.0.0.1:9", "--state"])
        .arg(state.path())
        .env("AGENTID_WITNESS_KEY", "sk_live_x")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two runs on one state folder at once: the second is refused (it could save an older
/// checkpoint over the newer one); the folder's lock is no note for `audit verify`.
#[actix_web::test]
async fn one_witness_run_at_a_time_holds_the_state_folder() {
    let app = spawn_app().await;
    fill(&app, 2).await;
    checkpoint_at(&app, 2).await;
    let state = tempfile::tempdir().unwrap();
    assert!(witness(&app, state.path()).await.status.success());
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(state.path().join("lock"))
        .unwrap();
    lock.lock().unwrap();
    let out = witness(&app, state.path()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("another witness run"), "{err}");
    lock.unlock().unwrap();
    assert!(witness(&app, state.path()).await.status.success());
}

/// A service that answers with a redirect does not send the witness, and its key, elsewhere:
/// the witness reads the service's own answers only.
#[actix_web::test]
async fn the_witness_follows_no_redirect() {
    use crate::domains::{ok, Http};
    let elsewhere = Http::start(ok("x").as_bytes());
    let redirecting = Http::start(
        format!(
            "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{}/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            elsewhere.port
        )
        .as_bytes(),
    );
    let state = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}", redirecting.port);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"));
    cmd.args(["audit", "witness", "--url", &url, "--state"])
        .arg(state.path())
        .env("AGENTID_WITNESS_KEY", "sk_live_x");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("302"), "{err}");
    assert_eq!(redirecting.hits(), 1);
    assert_eq!(elsewhere.hits(), 0, "the witness followed the redirect");
}

// ---- The database's own refusals ------------------------------------------------------------------

#[actix_web::test]
async fn no_write_path_overwrites_the_log_or_a_revocation() {
    let app = spawn_app().await;
    fill(&app, 20).await;
    checkpoint_at(&app, 20).await;
    let org = &app.org.org_id;
    let mut refused = vec![
        "UPDATE audit_tree_nodes SET hash = hash".to_owned(),
        "DELETE FROM audit_tree_nodes".to_owned(),
        "UPDATE audit_checkpoints SET note = note".to_owned(),
        "DELETE FROM audit_checkpoints".to_owned(),
        "UPDATE audit_blocks SET n_valid = 0".to_owned(),
        "DELETE FROM audit_block_agents".to_owned(),
        format!(
            "INSERT INTO audit_checkpoints SELECT * FROM audit_checkpoints WHERE org_id = '{org}' \
             ON CONFLICT (org_id, mode, tree_size) DO UPDATE SET note = 'x'"
        ),
        format!(
            "INSERT INTO audit_tree_nodes SELECT * FROM audit_tree_nodes WHERE org_id = '{org}' \
             ON CONFLICT (org_id, mode, height, idx) DO UPDATE SET hash = excluded.hash"
        ),
    ];
    if app.db.is_postgres() {
        for t in [
            "audit_tree_nodes",
            "audit_checkpoints",
            "audit_blocks",
            "audit_block_agents",
        ] {
            refused.push(format!("TRUNCATE {t}"));
        }
    } else {
        refused.extend([
            "INSERT OR REPLACE INTO audit_blocks SELECT * FROM audit_blocks".to_owned(),
            "REPLACE INTO audit_block_agents SELECT * FROM audit_block_agents".to_owned(),
            "INSERT OR REPLACE INTO audit_tree_nodes SELECT * FROM audit_tree_nodes".to_owned(),
            "INSERT OR REPLACE INTO audit_checkpoints SELECT * FROM audit_checkpoints".to_owned(),
            "INSERT INTO audit_blocks SELECT * FROM audit_blocks WHERE true \
             ON CONFLICT DO UPDATE SET n_valid = 0"
                .to_owned(),
        ]);
    }
    for sql in &refused {
        let err = app.raw_execute(sql).await.expect_err(sql);
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }

    let (agent, token) = app.agent().await;
    assert_eq!(app.revoke(&agent, Some("stolen")).await.status, 200);
    let mut refused = vec![
        format!("UPDATE agents SET revoked_at = NULL WHERE id = '{agent}'"),
        format!("UPDATE agents SET revoked_at = revoked_at + 1 WHERE id = '{agent}'"),
        format!("UPDATE agents SET revocation_reason = NULL WHERE id = '{agent}'"),
        format!("DELETE FROM agents WHERE id = '{agent}'"),
    ];
    if app.db.is_postgres() {
        refused.push("TRUNCATE agents".to_owned());
    } else {
        refused.push(format!(
            "INSERT OR REPLACE INTO agents SELECT * FROM agents WHERE id = '{agent}'"
        ));
    }
    for sql in &refused {
        let err = app.raw_execute(sql).await.expect_err(sql);
        assert!(err.to_string().contains("revocation is final"), "{sql}: {err}");
    }
    // Renewing other columns is still allowed; the agent stays revoked across a restart.
    app.raw_execute(&format!(
        "UPDATE agents SET description = 'x' WHERE id = '{agent}'"
    ))
    .await
    .unwrap();
    let app = app.restart().await;
    assert_eq!(app.verify(&token).await["error"], "TOKEN_REVOKED");
}

/// PostgreSQL: the service runs as a role that owns nothing; the owner migrates. Such a role
/// can neither switch the triggers off nor drop them, nor change the log.
#[actix_web::test]
async fn the_service_runs_as_a_role_that_owns_nothing_and_cannot_change_the_log() {
    use sqlx::Connection;
    let Some(admin) = crate::helpers::postgres_admin_url() else {
        return; // SQLite has no roles
    };
    let role = format!("agentid_svc_{}", ulid::Ulid::new().to_string().to_lowercase());
    let as_role = |url: &str| url.replacen("://postgres@", &format!("://{role}@"), 1);
    assert_ne!(
        as_role(&admin),
        admin,
        "the tests' PostgreSQL URL names user postgres"
    );
    let mut su = sqlx::PgConnection::connect(&admin).await.unwrap();
    sqlx::query(&format!("CREATE ROLE {role} LOGIN"))
        .execute(&mut su)
        .await
        .unwrap();

    // Before the owner has migrated, the role cannot start the service, and says why.
    let dir = tempfile::tempdir().unwrap();
    let fresh = crate::helpers::TestDb::new(dir.path()).await;
    let cfg = crate::helpers::test_config(&as_role(&fresh.url), dir.path().join("key.pem"));
    let err = agentid::Application::build(cfg)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("agentid migrate"), "{err}");
    drop(fresh);

    // The owner migrates and grants; the service then runs as the role.
    let migrate_as = role.clone();
    let app = spawn_app_with(Options {
        tweak: Box::new(move |c| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentid"))
                .args([
                    "migrate",
                    "--database-url",
                    &c.database_url,
                    "--grant",
                    &migrate_as,
                ])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            c.database_url = c
                .database_url
                .replacen("://postgres@", &format!("://{migrate_as}@"), 1);
        }),
        ..Options::default()
    })
    .await;
    assert!(app.config.database_url.contains(&role));
    fill(&app, 5).await;
    let (agent, token) = app.agent().await;
    assert_eq!(app.revoke(&agent, None).await.status, 200);
    assert_eq!(app.verify(&token).await["error"], "TOKEN_REVOKED");
    checkpoint_at(&app, 6).await;
    let r = audit(&app, &[]).await;
    assert!(r.ok(), "{}", failures(&r));

    let mut conn = sqlx::PgConnection::connect(&app.config.database_url)
        .await
        .unwrap();
    for sql in [
        "SET session_replication_role = replica".to_owned(),
        "ALTER TABLE audit_blocks DISABLE TRIGGER ALL".to_owned(),
        "DROP TRIGGER audit_blocks_no_update ON audit_blocks".to_owned(),
        "ALTER TABLE agents DISABLE TRIGGER agents_revocation_is_final".to_owned(),
        "UPDATE audit_blocks SET n_valid = 0".to_owned(),
        "DELETE FROM audit_checkpoints".to_owned(),
        "DELETE FROM audit_tree_nodes".to_owned(),
        "TRUNCATE audit_blocks".to_owned(),
        "CREATE TABLE x (y int)".to_owned(),
        format!("UPDATE agents SET revoked_at = NULL WHERE id = '{agent}'"),
    ] {
        let err = sqlx::query(&sql).execute(&mut conn).await.expect_err(&sql);
        let msg = err.to_string();
        assert!(
            ["permission denied", "must be owner", "revocation is final"]
                .iter()
                .any(|m| msg.contains(m)),
            "{sql}: {msg}"
        );
    }
    drop(conn);
    drop(app);
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&mut su)
        .await
        .unwrap();
}

/// A checkpoint of the empty tree (what a witness saves of a ledger before its first record)
/// is one every ledger extends: `audit verify` given it passes. One of size 0 with another
/// root is a checkpoint no log could sign.
#[actix_web::test]
async fn audit_verify_takes_a_checkpoint_of_the_empty_tree() {
    let app = spawn_app().await;
    let empty = app.get("/v1/log/checkpoint", Some(app.secret())).await.text();
    assert_eq!(empty.lines().nth(1), Some("0"), "{empty}");
    fill(&app, 3).await;
    let note = checkpoint_at(&app, 3).await;
    let r = audit(&app, &[empty, note]).await;
    assert!(r.ok(), "{}", failures(&r));
}
