//! The binary as a new user meets it: first start, printed keys, `org create`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::json;

use crate::helpers::{client, read};

pub struct Server {
    pub child: Child,
    pub base: String,
    pub stdout: Vec<String>,
}

impl Server {
    /// A key the first start printed (`secret_live`, `publishable_live`, …).
    pub fn printed_key(&self, name: &str) -> String {
        self.stdout
            .iter()
            .find_map(|l| l.trim().strip_prefix(name).map(|k| k.trim().to_owned()))
            .unwrap_or_else(|| panic!("{name} was not printed: {:?}", self.stdout))
    }

    /// Registers an agent with a secret key; returns its id and token.
    pub async fn register(&self, key: &str, name: &str) -> (String, String) {
        let res = read(
            client()
                .post(format!("{}/v1/agents/register", self.base))
                .insert_header(("Authorization", format!("Bearer {key}")))
                .send_json(&json!({"name": name, "issuer_domain": "example.com", "scopes": ["read:x"]}))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(res.status, 201, "{}", res.text());
        let body = res.json();
        (
            body["agent_id"].as_str().unwrap().to_owned(),
            body["token"].as_str().unwrap().to_owned(),
        )
    }
}

/// Verifies `token` as a receiver (publishable `key`) in a loop until `stop`, counting into
/// `answered` every 200 whose body fully arrived. Ends early when the server is gone, and
/// returns how many answers were 503 (the audit log unavailable).
pub fn hammer(
    base: String,
    token: String,
    key: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> actix_web::rt::task::JoinHandle<usize> {
    use std::sync::atomic::Ordering;
    actix_web::rt::spawn(async move {
        let c = client();
        let mut unavailable = 0;
        while !stop.load(Ordering::SeqCst) {
            let sent = c
                .get(format!("{base}/v1/verify/{token}"))
                .insert_header(("Authorization", format!("Bearer {key}")))
                .send()
                .await;
            match sent {
                Ok(mut res) if res.status() == 200 => {
                    if res.body().await.is_ok() {
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(res) if res.status() == 503 => unavailable += 1,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        unavailable
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `agentid serve` in `dir` and reads stdout up to the "listening" line.
pub fn start_server(dir: &Path, db_url: Option<&str>, extra_env: &[(&str, &str)]) -> Server {
    spawn_server(dir, db_url, extra_env, Stdio::inherit())
}

/// Like `start_server`, with stderr (the logs) written to `log_file`.
pub fn start_server_logging(
    dir: &Path,
    db_url: Option<&str>,
    extra_env: &[(&str, &str)],
    log_file: &Path,
) -> Server {
    let file = std::fs::File::create(log_file).unwrap();
    spawn_server(dir, db_url, extra_env, Stdio::from(file))
}

pub fn spawn_server(dir: &Path, db_url: Option<&str>, extra_env: &[(&str, &str)], stderr: Stdio) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentid"));
    cmd.arg("serve")
        .current_dir(dir)
        .env("AGENTID_BIND", "127.0.0.1:0")
        .env("AGENTID_METRICS_BIND", "off")
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(stderr);
    if let Some(url) = db_url {
        cmd.env("DATABASE_URL", url);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start agentid");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdout = Vec::new();
    let base = loop {
        let line = lines.next().expect("agentid exited before listening").unwrap();
        stdout.push(line.clone());
        if let Some(rest) = line.strip_prefix("agentid: listening on ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    // The organization a first start created issues under example.com, as the operator grants.
    if let Some(org) = stdout.iter().find_map(|l| {
        l.strip_prefix("agentid: created organization default (")
            .and_then(|r| r.split(',').next())
    }) {
        let mut approve = Command::new(env!("CARGO_BIN_EXE_agentid"));
        approve
            .args(["domain", "approve", "--org", org, "example.com"])
            .current_dir(dir)
            .env_remove("DATABASE_URL");
        if let Some(url) = db_url {
            approve.env("DATABASE_URL", url);
        }
        for (k, v) in extra_env {
            approve.env(k, v);
        }
        let out = approve.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    Server { child, base, stdout }
}

#[actix_web::test]
async fn first_start_creates_everything_and_prints_keys_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), None, &[]);
    let out = server.stdout.join("\n");
    assert!(out.contains("will not be shown again"), "{out}");
    let secret = server
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("secret_live").map(|k| k.trim().to_owned()))
        .expect("secret_live printed");
    assert!(secret.starts_with("sk_live_"));
    assert!(dir.path().join("data/agentid.db").exists());
    #[cfg(unix)]
    {
        // The key, the database and its WAL files: readable by their owner only.
        use std::os::unix::fs::PermissionsExt;
        for f in [
            "signing-key.pem",
            "agentid.db",
            "agentid.db-wal",
            "agentid.db-shm",
        ] {
            let path = dir.path().join("data").join(f);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{f}: {mode:o}");
        }
    }

    // The printed key works at once, under the name the printed command grants.
    let approve = server
        .stdout
        .iter()
        .find_map(|l| l.trim().strip_prefix("agentid domain approve "))
        .unwrap_or_else(|| panic!("no grant printed: {out}"));
    assert!(approve.contains(" demo.example"), "{approve}");
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["domain", "approve"])
        .args(approve.split_whitespace())
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = client();
    let res = read(
        c.post(format!("{}/v1/agents/register", server.base))
            .insert_header(("Authorization", format!("Bearer {secret}")))
            .send_json(&json!({"name": "demo", "issuer_domain": "demo.example", "scopes": ["read:docs"]}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(res.status, 201, "{}", res.text());

    // `org create` works while the server runs, and prints the designed JSON.
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["org", "create", "--name", "Acme", "--plan", "growth"])
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let org: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(org["org_id"].as_str().unwrap().starts_with("org_"));
    assert_eq!(org["name"], "Acme");
    assert_eq!(org["plan"], "growth");
    for (field, prefix) in [
        ("secret_live", "sk_live_"),
        ("secret_test", "sk_test_"),
        ("publishable_live", "pk_live_"),
        ("publishable_test", "pk_test_"),
    ] {
        assert!(
            org["keys"][field].as_str().unwrap().starts_with(prefix),
            "{field}"
        );
    }
    let res = read(
        c.get(format!("{}/v1/agents", server.base))
            .insert_header((
                "Authorization",
                format!("Bearer {}", org["keys"]["secret_live"].as_str().unwrap()),
            ))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(res.status, 200);
    drop(server);

    // A second start finds an organization: no new keys are printed.
    let again = start_server(dir.path(), None, &[]);
    assert!(
        !again.stdout.join("\n").contains("sk_live_"),
        "{:?}",
        again.stdout
    );
}

/// With `--no-default-org` (for a service manager that keeps stdout in its logs), a first
/// start creates no organization and prints no key; one made with `org create` works.
#[actix_web::test]
async fn a_first_start_without_a_default_organization_prints_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(dir.path(), None, &[("AGENTID_NO_DEFAULT_ORG", "true")]);
    let out = server.stdout.join("\n");
    assert!(
        !out.contains("created organization") && !out.contains("sk_"),
        "{out}"
    );
    let created = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["org", "create", "--name", "Acme", "--plan", "growth"])
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let org: serde_json::Value = serde_json::from_slice(&created.stdout).unwrap();
    let key = org["keys"]["secret_live"].as_str().unwrap();
    let res = read(
        client()
            .get(format!("{}/v1/agents", server.base))
            .insert_header(("Authorization", format!("Bearer {key}")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let flag = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&flag.stdout).contains("--no-default-org"));
}

#[test]
fn org_create_refuses_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .output()
            .unwrap()
    };
    assert!(
        run(&["migrate"]).status.success(),
        "only serve and migrate create a database"
    );
    let out = run(&["org", "create", "--name", "E", "--plan", "enterprise"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("verify"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["org", "create", "--name", "E", "--plan", "gold"]);
    assert!(!out.status.success());
    // The spec's tables: a free plan's tokens last at most a day, and no plan's over a year;
    // custom rate limits are for enterprise only.
    for (plan, flag, value) in [
        ("free", "--max-expiry-seconds", "31536000"),
        ("free", "--verify-limit", "100000"),
        ("enterprise", "--max-expiry-seconds", "31536001"),
    ] {
        let mut args = vec!["org", "create", "--name", "E", "--plan", plan, flag, value];
        if plan == "enterprise" {
            args.extend(["--verify-limit", "10", "--other-limit", "10"]);
        }
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{plan} {flag} {value} was taken");
        assert!(stderr.contains(&flag[2..].replace('-', "_")), "{stderr}");
    }
    let out = run(&[
        "org",
        "create",
        "--name",
        "E",
        "--plan",
        "enterprise",
        "--verify-limit",
        "100000",
        "--other-limit",
        "5000",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A second instance on a port in use: a clear error and a non-zero exit, before anything is
/// created (a default organization made then would have its keys never shown) and without
/// a panic from actors torn down with the runtime.
#[test]
fn serve_on_a_port_in_use_fails_cleanly_before_creating_anything() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    for (bind, metrics) in [(addr.as_str(), "off"), ("127.0.0.1:0", addr.as_str())] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .arg("serve")
            .current_dir(dir.path())
            .env("AGENTID_BIND", bind)
            .env("AGENTID_METRICS_BIND", metrics)
            .env("RUST_LOG", "warn")
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("cannot listen on {addr}")), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!dir.path().join("data").exists(), "nothing is created");
    }
    // Every address without a public URL: the service would call itself http://0.0.0.0.
    for bind in ["0.0.0.0:0", "[::]:0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(["serve", "--metrics-bind", "off"])
            .current_dir(dir.path())
            .env("AGENTID_BIND", bind)
            .env_remove("AGENTID_PUBLIC_URL")
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("needs --public-url"), "{stderr}");
        assert!(!dir.path().join("data").exists(), "nothing is created");
    }
}

/// SQLite serves one instance: a second `serve` on the same database refuses to start,
/// naming the lock and the process that holds it, and creates nothing; the other commands
/// keep working beside the server; once it stops, the database serves again.
#[actix_web::test]
async fn a_second_serve_on_one_sqlite_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start_server(dir.path(), None, &[]);
    let second = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .arg("serve")
        .current_dir(dir.path())
        .env("AGENTID_BIND", "127.0.0.1:0")
        .env("AGENTID_METRICS_BIND", "off")
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    let pid = first.child.id();
    assert!(
        stderr.contains(&format!("process {pid} is serving this database already"))
            && stderr.contains("data/agentid.db.lock"),
        "{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&second.stdout).contains("sk_live_"),
        "no second set of keys"
    );

    let listed = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["org", "list"])
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let orgs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(orgs.as_array().map(Vec::len), Some(1), "{orgs}");

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let again = start_server(dir.path(), None, &[]);
    assert!(again.base.starts_with("http://"));
}

/// `serve` refuses a signing key file that its group or others may read, saying how to fix
/// it, as ssh does; and starts once it is fixed.
#[cfg(unix)]
#[test]
fn serve_refuses_a_key_file_others_may_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("data/signing-key.pem");
    agentid::keys::KeyRing::create(&key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .arg("serve")
        .current_dir(dir.path())
        .env("AGENTID_BIND", "127.0.0.1:0")
        .env("AGENTID_METRICS_BIND", "off")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("can be read by others") && err.contains("chmod 600"),
        "{err}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(start_server(dir.path(), None, &[]));
}

/// `key disable` takes the key from standard input; one given as an argument is refused with
/// a message that says so, not clap's "unexpected argument".
#[test]
fn key_disable_says_the_key_is_read_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["key", "disable", "sk_live_x"])
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("read from standard input"), "{err}");
    assert!(err.contains("| agentid key disable"), "{err}");
}

/// A lost org id is found again, and an organization's keys are listed, never shown.
#[actix_web::test]
async fn org_list_and_key_list_find_things_again_without_showing_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::TestDb::new(dir.path()).await;
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(args)
            .args(["--database-url", &db.url])
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert!(run(&["migrate"]).0, "only serve and migrate create a database");
    let (ok, created, err) = run(&["org", "create", "--name", "Acme", "--plan", "growth"]);
    assert!(ok, "{err}");
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let id = created["org_id"].as_str().unwrap();
    let (ok, listed, _) = run(&["org", "list"]);
    assert!(ok);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["org_id"] == id && o["name"] == "Acme" && o["plan"] == "growth"),
        "{listed}"
    );
    let (ok, keys, _) = run(&["key", "list", "--org", id]);
    assert!(ok);
    for field in [
        "secret_live",
        "secret_test",
        "publishable_live",
        "publishable_test",
    ] {
        assert!(
            !keys.contains(created["keys"][field].as_str().unwrap()),
            "a key was shown: {keys}"
        );
    }
    let keys: serde_json::Value = serde_json::from_str(&keys).unwrap();
    assert_eq!(keys.as_array().unwrap().len(), 4, "{keys}");
    assert!(keys
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["key"].as_str().unwrap().contains('…') && k["disabled"] == false));
    let (ok, _, err) = run(&["key", "list", "--org", "org_nope"]);
    assert!(!ok && err.contains("org list"), "{err}");

    // A named key; then, by its id alone, disabled.
    let (ok, key, err) = run(&[
        "key",
        "create",
        "--org",
        id,
        "--kind",
        "secret",
        "--mode",
        "live",
        "--name",
        "billing server",
    ]);
    assert!(ok && key.trim().starts_with("sk_live_"), "{err}");
    let made = err
        .trim()
        .strip_prefix("agentid: created ")
        .unwrap_or_else(|| panic!("{err}"));
    let (_, keys, _) = run(&["key", "list", "--org", id]);
    let keys: serde_json::Value = serde_json::from_str(&keys).unwrap();
    let named = keys.as_array().unwrap().iter().find(|k| k["id"] == made).unwrap();
    assert_eq!(
        (&named["name"], &named["last_used_at"], &named["disabled"]),
        (
            &serde_json::json!("billing server"),
            &serde_json::Value::Null,
            &serde_json::json!(false)
        )
    );
    assert!(keys
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["id"].as_str().unwrap().starts_with("key_")));
    let (ok, said, err) = run(&["key", "disable", "--id", made]);
    assert!(ok && said.contains("disabled"), "{err}");
    let (_, keys, _) = run(&["key", "list", "--org", id]);
    let keys: serde_json::Value = serde_json::from_str(&keys).unwrap();
    assert!(keys
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["id"] == made && k["disabled"] == true));
    let (ok, _, err) = run(&["key", "disable", "--id", "key_nope"]);
    assert!(!ok && err.contains("no key key_nope"), "{err}");
    let (ok, _, err) = run(&[
        "key", "create", "--org", id, "--kind", "secret", "--mode", "live", "--name", "",
    ]);
    assert!(!ok && err.contains("name"), "{err}");
}

/// Every command but `serve` and `migrate` refuses to create a database: run from another
/// folder, or given a mistyped path, it says which database it looked for instead of
/// quietly working on a new, empty one. `serve` makes the default folder only.
#[test]
fn commands_never_make_a_database_they_were_not_asked_to() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .env("AGENTID_SIGNING_KEY_FILE", dir.path().join("key.pem"))
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["org", "create", "--name", "A", "--plan", "free"][..],
        &["org", "list"],
        &["signing-key", "list"],
        &["key", "list", "--org", "org_x"],
    ] {
        let (ok, err) = run(args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.contains("no database at ./data/agentid.db"),
            "{args:?}: {err}"
        );
        assert!(err.contains("agentid migrate"), "{args:?}: {err}");
    }
    assert!(!dir.path().join("data").exists(), "a folder was made");
    let elsewhere = format!("sqlite://{}/missing/folder/x.db", dir.path().display());
    let (ok, err) = run(&["serve", "--database-url", &elsewhere]);
    assert!(!ok);
    assert!(err.contains("folder") && err.contains("does not exist"), "{err}");
    assert!(!dir.path().join("missing").exists());
}

/// `agentid domain approve / list / release`: by org id or by a name only one organization
/// has; never with a key file that is not the fleet's.
#[actix_web::test]
async fn the_operator_grants_lists_and_releases_names() {
    let dir = tempfile::tempdir().unwrap();
    let _server = start_server(dir.path(), None, &[]);
    let agentid = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .env_remove("AGENTID_SIGNING_KEY_FILE")
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        assert!(agentid(&["org", "create", "--name", "Twin", "--plan", "free"])
            .status
            .success());
    }
    let out = agentid(&["org", "create", "--name", "Acme", "--plan", "free"]);
    let acme: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let acme_id = acme["org_id"].as_str().unwrap();

    let out = agentid(&["domain", "approve", "--org", "Acme", "acme.example"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let granted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&granted["org_id"], &granted["method"]),
        (&json!(acme_id), &json!("operator"))
    );
    let out = agentid(&["domain", "approve", "--org", "Twin", "twin.example"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 organizations are named Twin"));
    let out = agentid(&[
        "domain",
        "approve",
        "--org",
        "Twin",
        "acme.example",
        "--signing-key-file",
        "/nonexistent",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no signing key file"),
        "{out:?}"
    );
    let out = agentid(&["domain", "approve", "--org", "default", "acme.example"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--force"),
        "{out:?}"
    );

    let out = agentid(&["domain", "list", "--org", acme_id]);
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        listed,
        json!([{"domain": "acme.example", "status": "verified", "org_ids": [acme_id], "method": "operator",
                "since": granted["verified_at"]}])
    );
    let out = agentid(&["domain", "release", "--org", acme_id, "ACME.example"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = agentid(&["domain", "list", "--org", acme_id]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let out = agentid(&["domain", "release", "--org", acme_id, "acme.example"]);
    assert!(!out.status.success());
}

/// `agentid token inspect` explains a token without a database, and with `--url` says
/// whether the service knows its key and what its status list says; a malformed token is a
/// clear error.
#[actix_web::test]
async fn token_inspect_explains_a_token_and_asks_the_service_when_told() {
    let app = crate::helpers::spawn_app().await;
    let (id, token) = app.agent().await;
    let inspect = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_agentid"))
                .args(["token", "inspect"])
                .args(args)
                .env("DATABASE_URL", "sqlite:///nonexistent/agentid.db")
                .output()
                .unwrap()
        })
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let alone = json(&inspect(vec![token.clone()]).await.unwrap());
    assert_eq!(alone["claims"]["sub"], id.as_str());
    assert_eq!(alone["header"]["alg"], "EdDSA");
    let left = alone["expires_in_seconds"].as_i64().unwrap();
    assert!((86_300..=86_400).contains(&left), "{left}");
    assert!(alone.get("kid_known").is_none(), "no service asked without --url");

    let asked = json(
        &inspect(vec![token.clone(), "--url".into(), app.base.clone()])
            .await
            .unwrap(),
    );
    assert_eq!(asked["kid_known"], true);
    assert_eq!(asked["signature"], "valid", "{asked}");
    assert_eq!(asked["status"]["value"], "valid", "{asked}");
    // A token whose signature was tampered with says so.
    let (input, sig) = token.rsplit_once('.').unwrap();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    let tampered = format!("{input}.{flipped}{}", &sig[1..]);
    let said = json(
        &inspect(vec![tampered, "--url".into(), app.base.clone()])
            .await
            .unwrap(),
    );
    assert_eq!(said["signature"], "invalid", "{said}");
    // From standard input, out of the shell's history.
    let piped = {
        let token = token.clone();
        tokio::task::spawn_blocking(move || {
            use std::io::Write as _;
            let mut child = Command::new(env!("CARGO_BIN_EXE_agentid"))
                .args(["token", "inspect", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(json(&piped)["claims"]["sub"], id.as_str());
    assert_eq!(app.revoke(&id, None).await.status, 200);
    let started = std::time::Instant::now();
    loop {
        let asked = json(
            &inspect(vec![token.clone(), "--url".into(), app.base.clone()])
                .await
                .unwrap(),
        );
        if asked["status"]["value"] == "revoked" {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{asked}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Another service's key set does not hold the key.
    let other = crate::helpers::spawn_app().await;
    let foreign = json(
        &inspect(vec![token.clone(), "--url".into(), other.base.clone()])
            .await
            .unwrap(),
    );
    assert_eq!(foreign["kid_known"], false);
    assert_eq!(foreign["signature"], "unknown key", "{foreign}");
    assert!(
        foreign["status"]["error"]
            .as_str()
            .unwrap()
            .contains("not one of"),
        "{foreign}"
    );

    for bad in ["not-a-token", "a.b.c", "eyJ9.eyJ9.x"] {
        let out = inspect(vec![bad.into()]).await.unwrap();
        assert!(!out.status.success(), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("agentid: ") && !err.contains("panicked"),
            "{bad}: {err}"
        );
    }
}

/// Attack: a token whose claims carry terminal controls (CSI as a C1 byte, DEL), a
/// right-to-left override and a line separator, inspected by a person: none reaches the
/// terminal raw, and the output is still JSON holding the same strings.
#[test]
fn token_inspect_escapes_what_a_token_could_plant_in_a_terminal() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let planted = "ok\u{9b}2J\u{7f}\u{202e}gpj.exe\u{2028}x\u{1b}[31m";
    let part = |v: serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let token = format!(
        "{}.{}.sig",
        part(serde_json::json!({"alg": "EdDSA", "kid": planted})),
        part(serde_json::json!({"sub": planted}))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["token", "inspect", &token])
        .env("DATABASE_URL", "sqlite:///nonexistent/agentid.db")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for c in ['\u{9b}', '\u{7f}', '\u{202e}', '\u{2028}', '\u{1b}'] {
        assert!(!text.contains(c), "{c:?} printed raw: {text:?}");
    }
    let read: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(read["claims"]["sub"], planted);
    assert_eq!(read["header"]["kid"], planted);

    // Times at the ends of the range have no difference to show, and no panic.
    let far = format!(
        "{}.{}.sig",
        part(serde_json::json!({"alg": "EdDSA"})),
        part(serde_json::json!({"iat": i64::MIN, "exp": i64::MIN}))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["token", "inspect", &far])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read["issued_seconds_ago"], serde_json::Value::Null, "{read}");

    // What a server it was sent to answers comes back escaped in the error too.
    let said = format!("{planted}\nok: forged line");
    let server = crate::domains::Http::start(
        format!(
            "HTTP/1.1 500 Oops\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{said}",
            said.len()
        )
        .as_bytes(),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args([
            "token",
            "inspect",
            &token,
            "--url",
            &format!("http://127.0.0.1:{}", server.port),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success() && err.contains("500"), "{err}");
    assert!(
        !err.lines().any(|l| l.starts_with("ok:")),
        "a line forged: {err:?}"
    );
    for c in ['\u{9b}', '\u{7f}', '\u{202e}', '\u{2028}', '\u{1b}'] {
        assert!(!err.contains(c), "{c:?} printed raw: {err:?}");
    }
}

/// `--help` shows where each setting comes from, never the database URL's value: it may hold
/// a password.
#[test]
fn help_never_shows_the_database_password() {
    for command in [
        &["serve", "--help"][..],
        &["migrate", "--help"],
        &["org", "create", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(command)
            .env("DATABASE_URL", "postgres://agentid:s3cret-pw@db.internal/agentid")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{command:?}: {text}");
        assert!(text.contains("DATABASE_URL"), "{command:?}: {text}");
        assert!(!text.contains("s3cret-pw"), "{command:?}: {text}");
    }
}

/// A password in a URL parameter the database driver does not know (`sslpassword`, a
/// misspelt `Password`) is refused by name, never printed: the driver would log it, value and
/// all, at start.
#[test]
fn an_unknown_database_url_parameter_is_refused_without_its_value() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgres://agentid@127.0.0.1:1/agentid?sslpassword=hunter2",
        "postgres://agentid@127.0.0.1:1/agentid?sslmode=disable&Password=hunter2",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args(["serve", "--bind", "127.0.0.1:0"])
            .current_dir(dir.path())
            .env("DATABASE_URL", url)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(!out.status.success(), "{url}");
        assert!(
            !stdout.contains("hunter2") && !stderr.contains("hunter2"),
            "{url}: {stdout}{stderr}"
        );
        assert!(stderr.contains("does not know"), "{url}: {stderr}");
    }
}

/// Settings a caller could make the writer allocate or wait without bound are refused at
/// once; the witness takes its key from the environment only.
#[test]
fn out_of_range_settings_and_a_key_on_the_command_line_are_refused() {
    for (name, value) in [
        ("--audit-batch-max", "0"),
        ("--audit-batch-max", "18446744073709551615"),
        ("--audit-linger-ms", "1001"),
        ("--workers", "0"),
        // The HTTP server takes at most 512: past that it panicked once the first
        // organization was made, its keys never shown.
        ("--workers", "513"),
        ("--db-max-connections", "0"),
        ("--checkpoint-interval-ms", "18446744073709551615"),
        ("--shutdown-drain-seconds", "86400"),
        // A pass looks its endpoint up (up to 5 s) before a push (up to 10 s).
        ("--ssf-lease-seconds", "16"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
            .args([
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--metrics-bind",
                "off",
                name,
                value,
            ])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name} {value}");
        assert!(
            !dir.path().join("data").exists(),
            "{name} {value}: nothing is made"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(name),
            "{name} {value}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args([
            "audit",
            "witness",
            "--url",
            "http://127.0.0.1:9",
            "--key",
            "sk_live_S3CRET",
            "--state",
        ])
        .arg(dir.path())
        .env_remove("AGENTID_WITNESS_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Could not check (2), not "the log broke its promise" (1): a cron job missing its
    // settings raises no false alarm.
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("AGENTID_WITNESS_KEY"), "{err}");
    assert!(!err.contains("S3CRET"), "{err}");
    // A staleness limit past any clock is refused, not a panic.
    let out = Command::new(env!("CARGO_BIN_EXE_agentid"))
        .args(["audit", "witness", "--url", "http://127.0.0.1:9", "--state"])
        .arg(dir.path())
        .args([
            "--checkpoint-interval-ms",
            "86400000",
            "--stale-after-intervals",
            "1000000",
        ])
        .env("AGENTID_WITNESS_KEY", "sk_live_x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("over a century"), "{err}");
}
