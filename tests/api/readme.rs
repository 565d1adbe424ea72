//! The documentation runs as written. The commands and receiver snippets of README.md and of
//! the pages of `docs/` are taken from the pages themselves and run against a live server:
//! the walkthrough's shell block as it stands (with the server's address for
//! `http://127.0.0.1:8080`, and `agentid` on the PATH naming the test's database), the blocks
//! that go on from it (found by their `## ` section title, on whichever page they are), and
//! each Python and JavaScript snippet saved under the file name on its first line
//! (`# NAME: COMMAND`) and run with the command there. The other tests that need a stock
//! receiver (`offline`, `rotation`, `status`) run these same snippets, so no copy can drift
//! from what the pages show. The pages' relative links are checked too.
//!
//! PyJWT, `cryptography` and jose are fetched when missing (PyJWT into the target directory,
//! jose with `npm ci --prefix tests/offline`); a machine without `python3` or `node` fails
//! these tests with a message that says so, never passes them unrun.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{spawn_app, spawn_app_with, Options};

/// The pages whose commands and snippets run here: the README and every page of `docs/`
/// (`every_page_of_docs_is_listed` fails for a page of `docs/` missing here).
const PAGES: &[(&str, &str)] = &[
    ("README.md", include_str!("../../README.md")),
    ("docs/receivers.md", include_str!("../../docs/receivers.md")),
    (
        "docs/shared-signals.md",
        include_str!("../../docs/shared-signals.md"),
    ),
    (
        "docs/issuers-and-keys.md",
        include_str!("../../docs/issuers-and-keys.md"),
    ),
    (
        "docs/verifiable-log.md",
        include_str!("../../docs/verifiable-log.md"),
    ),
    ("docs/fleet.md", include_str!("../../docs/fleet.md")),
    ("docs/oauth.md", include_str!("../../docs/oauth.md")),
    ("docs/operations.md", include_str!("../../docs/operations.md")),
    ("docs/performance.md", include_str!("../../docs/performance.md")),
    ("docs/gateways.md", include_str!("../../docs/gateways.md")),
    ("docs/delegation.md", include_str!("../../docs/delegation.md")),
    (
        "docs/signed-requests.md",
        include_str!("../../docs/signed-requests.md"),
    ),
];

/// A fenced block of a page, with the `## ` section it sits in.
struct Block {
    section: String,
    lang: String,
    text: String,
}

/// A page's lines outside its fenced blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The `## ` section titles of a page, in order.
fn sections(text: &str) -> Vec<&str> {
    prose(text).filter_map(|l| l.strip_prefix("## ")).collect()
}

/// Every fenced block of every page, in page order.
fn blocks() -> Vec<Block> {
    let mut out = Vec::new();
    for (page, text) in PAGES {
        let (mut section, mut open) = (String::new(), None::<Block>);
        for line in text.lines() {
            match open.as_mut() {
                Some(_) if line.starts_with("```") => out.extend(open.take()),
                Some(block) => {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
                None => {
                    if let Some(lang) = line.strip_prefix("```") {
                        open = Some(Block {
                            section: section.clone(),
                            lang: lang.trim().to_owned(),
                            text: String::new(),
                        });
                    } else if let Some(h) = line.strip_prefix("## ") {
                        section = h.to_owned();
                    }
                }
            }
        }
        assert!(open.is_none(), "{page} has a code block that never closes");
    }
    out
}

/// The shell blocks of the section titled `title`, on whichever page it is (titles are
/// unique across the pages: `section_titles_are_unique_across_the_pages`).
pub fn shell_blocks(title: &str) -> Vec<String> {
    let found: Vec<String> = blocks()
        .into_iter()
        .filter(|b| b.section == title && b.lang == "sh")
        .map(|b| b.text)
        .collect();
    assert!(!found.is_empty(), "no page has an sh block under \"## {title}\"");
    found
}

/// The one block of the pages in `lang` under `## section` (a gateway's configuration), as
/// written.
pub fn only_block(section: &str, lang: &str) -> String {
    let mut found: Vec<String> = blocks()
        .into_iter()
        .filter(|b| b.lang == lang && b.section == section)
        .map(|b| b.text)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "the pages have {} blocks in {lang} under \"## {section}\"",
        found.len()
    );
    found.remove(0)
}

/// A whole-file snippet: its name, the command that runs it, its text.
pub struct Snippet {
    pub name: String,
    pub command: String,
    pub text: String,
}

/// Every Python and JavaScript block of the pages whose first line is `# NAME: COMMAND` or
/// `// NAME: COMMAND`.
fn snippets() -> Vec<Snippet> {
    blocks()
        .into_iter()
        .filter(|b| b.lang == "python" || b.lang == "js")
        .filter_map(|b| {
            let first = b.text.lines().next()?;
            let head = first.strip_prefix("# ").or_else(|| first.strip_prefix("// "))?;
            let (name, command) = head.split_once(": ")?;
            (name.ends_with(".py") || name.ends_with(".mjs")).then(|| Snippet {
                name: name.to_owned(),
                command: command.to_owned(),
                text: b.text.clone(),
            })
        })
        .collect()
}

pub fn snippet(name: &str) -> Snippet {
    snippets()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no page has a snippet {name}"))
}

/// Where PyJWT is when Python lacks it (fetched there once), and whether it is ready.
struct Tools {
    pythonpath: Option<PathBuf>,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn succeeds(cmd: &mut Command) -> Result<bool, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.output().map(|o| o.status.success()).map_err(|e| {
        format!("`{program}` cannot run here ({e}); the pages' receiver snippets need python3 and node")
    })
}

fn fetch(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn provision() -> Result<Tools, String> {
    let has_pyjwt = |path: Option<&Path>| {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", "import jwt, cryptography, http_message_signatures"]);
        if let Some(p) = path {
            cmd.env("PYTHONPATH", p);
        }
        succeeds(&mut cmd)
    };
    let mut pythonpath = None;
    if !has_pyjwt(None)? {
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("offline-python");
        if !has_pyjwt(Some(&target))? {
            fetch(
                Command::new("python3")
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "--target",
                    ])
                    .arg(&target)
                    .arg("-r")
                    .arg(root().join("tests/offline/requirements.txt")),
                "installing PyJWT and cryptography (pip install --target target/tmp/offline-python)",
            )?;
        }
        pythonpath = Some(target);
    }
    succeeds(Command::new("node").arg("--version"))?;
    let modules = root().join("tests/offline/node_modules");
    let installed = ["jose", "@sd-jwt/jwt-status-list", "dpop"];
    if !installed.iter().all(|m| modules.join(m).exists()) {
        fetch(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
                .arg(root().join("tests/offline")),
            "npm ci --prefix tests/offline",
        )?;
    }
    Ok(Tools { pythonpath })
}

fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Result<Tools, String>> = OnceLock::new();
    TOOLS
        .get_or_init(provision)
        .as_ref()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A shell in `dir` with the receivers' libraries at hand.
pub fn shell(dir: &Path, script: &str) -> Command {
    let tools = tools();
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", script]).current_dir(dir);
    if let Some(p) = &tools.pythonpath {
        cmd.env("PYTHONPATH", p);
    }
    cmd
}

/// Saves the pages' snippet `name` in `dir` and runs it as its first line says, with
/// `TOKEN` and `BASE` set: what it prints as JSON, or its complaint. Blocking: call it off
/// the thread of a server it talks to.
pub fn run(name: &str, dir: &Path, token: &str, base: &str) -> Result<Value, String> {
    let s = snippet(name);
    std::fs::write(dir.join(&s.name), &s.text).unwrap();
    let modules = dir.join("node_modules");
    if s.name.ends_with(".mjs") && !modules.exists() {
        std::os::unix::fs::symlink(root().join("tests/offline/node_modules"), modules).unwrap();
    }
    let out = shell(dir, &s.command)
        .env("TOKEN", token)
        .env("BASE", base)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        return Err(stderr);
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "{name} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Runs `cmd` off the test's thread; its output, asserted successful (`what` names it).
pub async fn output_of(cmd: Command, what: &str) -> String {
    let mut cmd = cmd;
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The JSON answers `text` holds one after the other (curl prints each without a newline).
pub fn json_answers(text: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(text)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("not JSON answers ({e}): {text}"))
}

/// [`run`] off the test's thread, for snippets that call the test's own server.
pub async fn run_beside(name: &'static str, dir: &Path, token: &str, base: &str) -> Result<Value, String> {
    let (dir, token, base) = (dir.to_owned(), token.to_owned(), base.to_owned());
    tokio::task::spawn_blocking(move || run(name, &dir, &token, &base))
        .await
        .unwrap()
}

/// Every Python and JavaScript block of every page is a whole file that says how to run it,
/// under a name no other snippet has: the stock receivers run here, the libraries'
/// `receiver.py` and `receiver.mjs` in their own tests (`clients/python/tests/test_readme.py`,
/// `clients/typescript/test/readme.test.js`).
#[test]
fn the_readme_names_every_snippet_it_shows() {
    let names: Vec<String> = snippets().into_iter().map(|s| s.name).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "two snippets share a name: {names:?}");
    for name in [
        "verify_jwks.py",
        "verify_jwks.mjs",
        "verify_pem.py",
        "verify_pem.mjs",
        "status.py",
        "status.mjs",
        "receiver.py",
        "receiver.mjs",
        "agent_dpop.mjs",
        "agent_dpop.py",
        "agent_assertion.py",
        "receiver_audience.py",
        "receiver_audience.mjs",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} is on no page: {names:?}");
    }
    for b in blocks().iter().filter(|b| b.lang == "python" || b.lang == "js") {
        assert!(
            snippets().iter().any(|s| s.text == b.text),
            "a snippet without `NAME: COMMAND` on its first line:\n{}",
            b.text
        );
    }
}

/// Blocks are found by their section's title on whichever page it is, so no two pages may
/// share one.
#[test]
fn section_titles_are_unique_across_the_pages() {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (page, text) in PAGES {
        for title in sections(text) {
            if let Some((other, _)) = seen.iter().find(|(_, t)| *t == title) {
                panic!("\"## {title}\" is a section of both {other} and {page}");
            }
            seen.push((page, title));
        }
    }
}

/// Every page of `docs/` is in `PAGES`, so its commands and snippets are found and run.
#[test]
fn every_page_of_docs_is_listed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = PAGES
        .iter()
        .map(|(page, _)| page.to_string())
        .filter(|p| p.starts_with("docs/"))
        .collect();
    listed.sort();
    assert_eq!(
        listed, on_disk,
        "tests/api/readme.rs: PAGES must list every page of docs/"
    );
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings.
fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The targets of a line's inline links `[text](target)`, outside code spans.
fn link_targets(line: &str) -> Vec<String> {
    let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    outside_code
        .match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &outside_code[at + 2..];
            rest.find(')').map(|end| rest[..end].trim().to_owned())
        })
        .collect()
}

/// Every markdown file of the documentation: README.md, ARCHITECTURE.md and `docs/**`.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    walk(&root().join("docs"), &mut files);
    files.sort();
    files
}

/// Every relative link of the documentation names a file that exists, and a heading of it
/// when it names one (`page.md#anchor`).
#[test]
fn relative_links_point_to_files_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let shown = file.strip_prefix(root()).unwrap().display().to_string();
        for target in prose(&text).flat_map(link_targets) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !linked.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment {
                let heads = anchors(&std::fs::read_to_string(&linked).unwrap_or_default());
                if !heads.iter().any(|a| a == fragment) {
                    broken.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 20,
        "only {checked} relative links found: is the link reader broken?"
    );
}

/// The walkthrough as written (issue, verify, revoke, read the log), then in the same shell
/// the blocks that go on from it (the offline section's key download, Shared Signals,
/// organizations and keys, the log's proofs, key rotation), then every snippet, in a folder
/// of their own. Between blocks the test adds only a marker, and before the log's proofs a
/// wait for the first checkpoint.
#[actix_web::test]
async fn the_walkthrough_and_snippets_run_as_written() {
    // The walkthrough's own organization is granted example.com: the test organization
    // holds no name.
    let app = spawn_app_with(Options {
        domains: &[],
        ..Options::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let walkthrough = shell_blocks("Walkthrough: issue → verify → revoke → log").concat();
    assert!(walkthrough.contains("export BASE=http://127.0.0.1:8080\n"));
    let marker = "printf '\\n::block::\\n'\n";
    let checkpointed = "until [ \"$(curl -s $BASE/v1/log/checkpoint -H \"Authorization: Bearer $SK\" | sed -n 2p)\" -gt 0 ]; \
                        do sleep 0.1; done\n";
    let script = [
        walkthrough.replace("http://127.0.0.1:8080", &app.base),
        shell_blocks("Offline validation").concat(),
        shell_blocks("Telling your receivers (Shared Signals)").concat(),
        shell_blocks("Organizations and keys").concat(),
        format!("{checkpointed}{}", shell_blocks("Keeping the log honest")[0]),
    ]
    .join(marker);
    let bin = Path::new(env!("CARGO_BIN_EXE_agentid"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let in_shell = |script: &str| {
        let mut cmd = shell(dir.path(), script);
        cmd.env("PATH", &path)
            .env("DATABASE_URL", &app.db.url)
            .env("AGENTID_SIGNING_KEY_FILE", &app.config.signing_key_file);
        cmd
    };
    let stdout = output_of(in_shell(&script), "the pages' commands").await;
    let parts: Vec<&str> = stdout.split("\n::block::\n").collect();
    let [walked, offline, ssf, orgs, proofs] = &parts[..] else {
        panic!("five blocks' output expected: {stdout}");
    };
    let json = json_answers;
    let answers = json(walked);
    let [registered, valid, revoked, refused, log] = &answers[..] else {
        panic!("five answers expected: {walked}");
    };
    let (agent, token) = (
        registered["agent_id"].as_str().unwrap(),
        registered["token"].as_str().unwrap(),
    );
    assert_eq!(registered["issuer"], "example.com");
    assert_eq!(
        (&valid["valid"], &valid["agent_id"]),
        (&Value::Bool(true), &registered["agent_id"])
    );
    assert_eq!(revoked["revoked"], true);
    assert_eq!(
        refused,
        &serde_json::json!({"valid": false, "error": "TOKEN_REVOKED"})
    );
    let results: Vec<&Value> = log["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["result"])
        .collect();
    assert_eq!(results, ["revoked", "valid"], "{log}");
    assert!(offline.is_empty() && dir.path().join("agentid.pem").exists());

    // Shared Signals: discovery, the stream, its configuration, the poll with the SETs.
    let ssf = json(ssf);
    assert_eq!(ssf[0]["spec_version"], "1_0", "{ssf:?}");
    assert_eq!(ssf[1]["delivery"]["method"], "urn:ietf:rfc:8936", "{ssf:?}");
    let polled = ssf.last().unwrap();
    assert!(
        !polled["sets"].as_object().unwrap().is_empty(),
        "the poll holds the SETs: {polled}"
    );
    // Organizations and keys: the second organization, the lists, the log verified.
    assert!(
        orgs.contains("\"name\":\"Acme\"") && orgs.contains("\"disabled\":true"),
        "{orgs}"
    );
    assert!(orgs.contains("ok "), "audit verify: {orgs}");
    // The log: key, checkpoint, commitments and both proofs.
    assert!(proofs.contains("\nagentid-revocations "), "{proofs}");
    let proved = json(&proofs[proofs.find("\n{").expect("JSON after the checkpoint")..]);
    assert!(
        proved.iter().filter(|p| p["proof"].is_array()).count() == 2,
        "{proofs}"
    );

    // Offline, the revoked agent's token still validates with the keys alone ...
    for name in [
        "verify_jwks.py",
        "verify_jwks.mjs",
        "verify_pem.py",
        "verify_pem.mjs",
    ] {
        let claims = run_beside(name, dir.path(), token, &app.base)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (claims["sub"].as_str(), &claims["iss"]),
            (Some(agent), &Value::from("example.com")),
            "{name}"
        );
    }
    // ... and the status list shows it revoked (within 2 s of the revocation).
    for name in ["status.py", "status.mjs"] {
        let started = Instant::now();
        loop {
            let seen = run_beside(name, dir.path(), token, &app.base)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            if seen["status"] == 1 {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(3), "{name}: {seen}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Last (it ends the key these tokens were signed with): rotation, the new key listed next,
    // then the old one, distrusted, retired once a new key signs.
    let rotation = output_of(
        in_shell(&shell_blocks("Rotating signing keys").concat()),
        "the rotation block",
    )
    .await;
    let header: Value = serde_json::from_slice(
        &<_ as base64::Engine>::decode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            token.split('.').next().unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    let old = header["kid"].as_str().unwrap();
    assert!(
        rotation.contains("\"state\":\"next\"")
            && rotation.ends_with(&format!(
                "retired {old} (running instances refuse its tokens within 10 s)\n"
            )),
        "{rotation}"
    );
}

/// "Trusting an issuer" as written: the claim, then (once the test's DNS server publishes
/// the record the claim asks for) the proof, an agent under a name below it, the lists.
#[actix_web::test]
async fn trusting_an_issuer_runs_as_written() {
    let dns = crate::dns::TestDns::start().await;
    let addr = dns.addr;
    let app = spawn_app_with(Options {
        outbound: agentid::engine::outbound::OutboundConfig {
            dns_server: Some(addr),
            ..Default::default()
        },
        ..Options::default()
    })
    .await;
    let blocks = shell_blocks("Trusting an issuer");
    let [claim, prove] = &blocks[..] else {
        panic!("two blocks expected: {blocks:?}");
    };
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_agentid"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let run = |script: &str| {
        let mut cmd = shell(dir.path(), script);
        cmd.env("PATH", &path)
            .env("BASE", &app.base)
            .env("SK", app.secret())
            .env("DATABASE_URL", &app.db.url)
            .env("AGENTID_SIGNING_KEY_FILE", &app.config.signing_key_file);
        async move { json_answers(&output_of(cmd, "the section's commands").await) }
    };
    let claimed = run(claim).await;
    let challenge = &claimed[0]["challenge"]["dns"];
    assert_eq!(claimed[0]["status"], "pending", "{claimed:?}");
    dns.txt(
        challenge["name"].as_str().unwrap(),
        &[challenge["value"].as_str().unwrap()],
    );
    let proved = run(prove).await;
    let [verified, registered, listed, operator] = &proved[..] else {
        panic!("four answers expected: {proved:?}");
    };
    assert_eq!(
        (&verified["status"], &verified["method"]),
        (&Value::from("verified"), &Value::from("dns"))
    );
    assert_eq!(registered["issuer"], "eu.billing.example.net", "{registered}");
    assert!(listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["domain"] == "billing.example.net"));
    assert!(
        operator
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["domain"] == "billing.example.net"
                && d["status"] == "verified"
                && d["method"] == "dns"),
        "{operator}"
    );
}

/// The DPoP section as written: the agent's key and proofs made with panva's `dpop` (with an
/// Ed25519 key, then an ES256 one) and with PyJWT (the same commands), the token bound with
/// `curl`, checked online, and the proof refused when it comes again.
#[actix_web::test]
async fn the_dpop_section_runs_as_written() {
    let app = crate::helpers::spawn_app().await;
    let section = shell_blocks("Tokens bound to a key (DPoP)").concat();
    for (agent, alg) in [
        ("node agent_dpop.mjs", "Ed25519"),
        ("node agent_dpop.mjs", "ES256"),
        ("python3 agent_dpop.py", "EdDSA"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        for name in ["agent_dpop.mjs", "agent_dpop.py"] {
            std::fs::write(dir.path().join(name), snippet(name).text).unwrap();
        }
        std::os::unix::fs::symlink(
            root().join("tests/offline/node_modules"),
            dir.path().join("node_modules"),
        )
        .unwrap();
        let script = section.replace("node agent_dpop.mjs", agent);
        let mut cmd = shell(dir.path(), &script);
        cmd.env("BASE", &app.base)
            .env("SK", app.secret())
            .env("DPOP_ALG", alg);
        let answers = json_answers(&output_of(cmd, &format!("{agent} ({alg})")).await);
        let [valid, replayed] = &answers[..] else {
            panic!("two answers expected: {answers:?}");
        };
        assert_eq!(valid["valid"], true, "{agent} ({alg}): {valid}");
        assert!(valid["cnf"]["jkt"].is_string(), "{valid}");
        assert_eq!(
            replayed,
            &serde_json::json!({"valid": false, "error": "PROOF_REPLAYED"})
        );
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(
            files, 4,
            "the two snippets, node_modules and the agent's one key file"
        );
    }
}

/// "Keeping the log honest"'s witness and audit as written: the cron line's command (its
/// schedule dropped) with the test's server, key and a state folder, run twice around a
/// verification, then `audit verify --checkpoints` on that folder.
#[actix_web::test]
async fn witnessing_the_log_runs_as_written() {
    let app = spawn_app().await;
    let blocks = shell_blocks("Keeping the log honest");
    let (cron, audit) = (
        blocks
            .iter()
            .find(|b| b.contains("agentid audit witness"))
            .expect("the witness's cron line"),
        blocks
            .iter()
            .find(|b| b.starts_with("agentid audit verify"))
            .expect("the audit's block"),
    );
    let command = cron
        .strip_prefix("*/5 * * * *")
        .expect("a cron schedule first")
        .trim()
        .replace("sk_live_…", app.secret())
        .replace("https://id.example.com", &app.base);
    let audit = audit.lines().next().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("live");
    let local = |s: &str| s.replace("/var/lib/agentid-witness/live", state.to_str().unwrap());
    let (command, audit) = (local(&command), local(&audit));
    assert!(command.contains(state.to_str().unwrap()) && audit.contains(state.to_str().unwrap()));
    let bin = Path::new(env!("CARGO_BIN_EXE_agentid"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let run = |script: String| {
        let mut cmd = shell(dir.path(), &script);
        cmd.env("PATH", &path)
            .env("DATABASE_URL", &app.db.url)
            .env("AGENTID_SIGNING_KEY_FILE", &app.config.signing_key_file);
        cmd
    };
    let checkpointed = |n: u64| {
        format!(
            "until [ \"$(curl -s {}/v1/log/checkpoint -H \"Authorization: Bearer {}\" | sed -n 2p)\" -ge {n} ]; \
             do sleep 0.1; done\n",
            app.base,
            app.secret()
        )
    };
    let (_, token) = app.agent().await;
    assert_eq!(app.verify(&token).await["valid"], true);
    output_of(
        run(format!("{}{command}", checkpointed(1))),
        "the witness's first run",
    )
    .await;
    assert_eq!(app.verify(&token).await["valid"], true);
    output_of(
        run(format!("{}{command}", checkpointed(2))),
        "the witness's second run",
    )
    .await;
    // A run that found records past its checkpoint also leaves its note of them there.
    std::fs::write(state.join("uncovered"), "3 1796000000000\n").unwrap();
    let audited = output_of(run(audit), "the audit with the witness's checkpoints").await;
    assert!(audited.starts_with("ok "), "{audited}");
    assert!(
        state.read_dir().unwrap().next().is_some(),
        "the witness saved its checkpoint"
    );
}

/// "OAuth and MCP" as written: the agent's key and registration, its token from the token
/// endpoint (the assertion signed by the page's `agent_assertion.py`), then the receiver's
/// introspection and verification of it.
#[actix_web::test]
async fn the_oauth_page_runs_as_written() {
    let app = spawn_app().await;
    let script = [
        shell_blocks("An agent gets its own token").concat(),
        shell_blocks("A receiver checks what a token is for").concat(),
    ]
    .join("printf '\\n::block::\\n'\n");
    let dir = tempfile::tempdir().unwrap();
    let assertion = snippet("agent_assertion.py");
    std::fs::write(dir.path().join(&assertion.name), &assertion.text).unwrap();
    let mut cmd = shell(dir.path(), &script);
    cmd.env("BASE", &app.base).env("SK", app.secret());
    let stdout = output_of(cmd, "the OAuth page's commands").await;
    let parts: Vec<&str> = stdout.split("\n::block::\n").collect();
    let [agent, receiver] = &parts[..] else {
        panic!("two blocks' output expected: {stdout}");
    };
    let answers = json_answers(agent);
    let [answer, by_secret] = &answers[..] else {
        panic!("two token answers expected (by assertion, by secret): {agent}");
    };
    assert_eq!(by_secret["token_type"], "Bearer", "{by_secret}");
    assert!(by_secret["access_token"].is_string(), "{by_secret}");
    assert_eq!(
        (&answer["token_type"], &answer["expires_in"], &answer["scope"]),
        (
            &Value::from("Bearer"),
            &Value::from(900),
            &Value::from("tools:call")
        ),
        "{answer}"
    );
    let checked = json_answers(receiver);
    let [introspected, verified] = &checked[..] else {
        panic!("two answers expected: {receiver}");
    };
    assert_eq!(introspected["active"], true, "{introspected}");
    assert_eq!(introspected["aud"], "https://api.example/mcp");
    assert_eq!(
        (&verified["valid"], &verified["aud"], &verified["client_id"]),
        (
            &Value::Bool(true),
            &introspected["aud"],
            &introspected["client_id"]
        ),
        "{verified}"
    );
    let key = dir.path().join("agent-key.pem");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// "Agents acting for people" as written: the stand-in provider trusted, a person's ID token
/// exchanged, the task handed to a second agent, the person revoked; what verify says at
/// each step.
#[actix_web::test]
async fn the_delegation_page_runs_as_written() {
    let app = spawn_app().await;
    let marker = "printf '\\n::block::\\n'\n";
    let script = [
        shell_blocks("An identity provider vouches for a person").concat(),
        shell_blocks("Handing a task to another agent").concat(),
        shell_blocks("Revoking a person").concat(),
    ]
    .join(marker);
    let dir = tempfile::tempdir().unwrap();
    let idp = snippet("idp.py");
    std::fs::write(dir.path().join(&idp.name), &idp.text).unwrap();
    let mut cmd = shell(dir.path(), &script);
    cmd.env("BASE", &app.base).env("SK", app.secret());
    let stdout = output_of(cmd, "the delegation page's commands").await;
    let parts: Vec<&str> = stdout.split("\n::block::\n").collect();
    let [person, handed, revoked] = &parts[..] else {
        panic!("three blocks' output expected: {stdout}");
    };
    let verified = &json_answers(person)[0];
    assert_eq!(verified["valid"], true, "{verified}");
    assert_eq!(verified["sub"], "alice");
    assert_eq!(verified["scopes"], serde_json::json!(["read:mail"]));
    assert_eq!(verified["sub_id"]["iss"], "https://idp.example");
    assert_eq!(verified["act"]["sub"], verified["agent_id"]);
    let chain = &json_answers(handed)[0];
    assert_eq!(chain["sub"], "alice", "{chain}");
    assert_eq!(chain["act"]["sub"], chain["agent_id"]);
    assert_eq!(chain["act"]["act"]["sub"], verified["agent_id"]);
    let answers = json_answers(revoked);
    assert_eq!(answers[0]["sub"], "alice", "{revoked}");
    assert_eq!(
        answers[1],
        serde_json::json!({"valid": false, "error": "TOKEN_REVOKED"})
    );
    let key = dir.path().join("idp-key.pem");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
        0o600
    );
}
