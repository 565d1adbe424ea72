//! `examples/axum` runs as its README says: its command, with this test's server for
//! `AGENTID_URL` and a free port for `PORT`, serves `/orders` to a verified agent only.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Server;

/// The one `sh` block of an example's README.
pub fn readme_command(example: &str) -> (PathBuf, String) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(example);
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("an sh block");
    (dir, block.to_owned())
}

fn get(url: &str, token: Option<&str>) -> Result<(u16, String), String> {
    let mut req = ureq::get(url).timeout(Duration::from_secs(5));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    match req.call() {
        Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn the_axum_example_runs_as_its_readme_says() {
    let s = Server::start();
    let (_, token) = s.register(serde_json::json!({}));
    // Any organization can register agents: the example trusts example.com's, live ones only.
    s.approve("other.example");
    let (_, stranger) = s.register(serde_json::json!({"issuer_domain": "other.example"}));
    let (_, test_mode) = s.register_with(serde_json::json!({}), Some(&s.sk_test));
    let (dir, block) = readme_command("axum");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let command = block
        .replace("http://127.0.0.1:8080", &s.base)
        .replace("PORT=3000", &format!("PORT={port}"));
    assert!(
        command.contains(&s.base) && command.contains(&format!("PORT={port}")),
        "{block}"
    );
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &command])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    // The first run builds the example.
    while get(&format!("{base}/health"), None).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the example exited: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the example never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let answered = (
        get(&format!("{base}/orders"), Some(&token)),
        get(&format!("{base}/orders"), None),
        get(&format!("{base}/orders"), Some("not.a.token")),
        get(&format!("{base}/orders"), Some(&stranger)),
        get(&format!("{base}/orders"), Some(&test_mode)),
    );
    let _ = Command::new("pkill")
        .args(["-P", &child.id().to_string()])
        .status();
    let _ = child.kill();
    let _ = child.wait();
    let (ok, none, bad, foreign, test) = answered;
    let (status, body) = ok.unwrap();
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["issuer"], "example.com", "{body}");
    assert_eq!(none.unwrap().0, 401);
    assert_eq!(bad.unwrap().0, 401);
    assert_eq!(foreign.unwrap().0, 401);
    assert_eq!(test.unwrap().0, 401);
}
