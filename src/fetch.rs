//! The GETs of the binary's own commands (`audit witness`, `token inspect`), to the service's
//! URL the operator gave: the body of a 200, of at most 1 MiB, from that URL itself (a
//! redirect is an answer like any other than 200, never followed: the key asked with goes
//! nowhere else).

use std::io::Read as _;
use std::time::Duration;

/// The client of a command: no redirect followed, every call bounded by `timeout`.
pub(crate) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(timeout).redirects(0).build()
}

/// The most of an answer read.
const MAX_ANSWER: u64 = 1 << 20;

/// The body of `url`'s 200 answer, asked with the bearer `key` when given. Any other answer,
/// or one over 1 MiB, is an error that says so.
pub(crate) fn get(agent: &ureq::Agent, url: &str, key: Option<&str>) -> Result<Vec<u8>, String> {
    let mut req = agent.get(url);
    if let Some(k) = key {
        req = req.set("Authorization", &format!("Bearer {k}"));
    }
    let res = match req.call() {
        Ok(res) if res.status() == 200 => res,
        Ok(res) => return Err(format!("GET {url}: {}", res.status())),
        Err(ureq::Error::Status(code, res)) => {
            let mut body = String::new();
            let _ = res.into_reader().take(300).read_to_string(&mut body);
            return Err(format!("GET {url}: {code} {}", body.trim()));
        }
        Err(e) => return Err(format!("GET {url}: {e}")),
    };
    let mut body = Vec::new();
    res.into_reader()
        .take(MAX_ANSWER + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("GET {url}: {e}"))?;
    if body.len() as u64 > MAX_ANSWER {
        return Err(format!("GET {url}: an answer over 1 MiB"));
    }
    Ok(body)
}
