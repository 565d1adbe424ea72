//! A URL as a DPoP proof's `htu` is compared: RFC 3986's syntax- and scheme-based
//! normalization.

/// A URL as `htu` is compared (RFC 9449 §4.3): without its query and fragment, normalized as
/// RFC 3986 §6.2.2 and §6.2.3 say (scheme and host in lower case, no default port, an empty
/// path as `/`, percent-encodings of unreserved characters decoded and the others' hex digits
/// in upper case, in the host lower case like the rest of it, dot segments removed), so that
/// two ways of writing one URL match. A host's trailing dot stays: it names another host.
pub(crate) fn htu_form(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let scheme = scheme.to_ascii_lowercase();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, host) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut host = percent_normal(host).to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => ":443",
        "http" => ":80",
        _ => "",
    };
    if !default_port.is_empty() && host.ends_with(default_port) {
        host.truncate(host.len() - default_port.len());
    }
    if host.ends_with(':') {
        host.pop();
    }
    let path = if path.is_empty() {
        "/".to_owned()
    } else {
        remove_dot_segments(&percent_normal(path))
    };
    match userinfo {
        Some(u) => format!("{scheme}://{}@{host}{path}", percent_normal(u)),
        None => format!("{scheme}://{host}{path}"),
    }
}

/// `s` with each percent-encoding of an unreserved character decoded, and the others' hex
/// digits in upper case (RFC 3986 §6.2.2.1, §6.2.2.2).
fn percent_normal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if let (b'%', Some(&h), Some(&l)) = (b[i], b.get(i + 1), b.get(i + 2)) {
            if let (Some(h), Some(l)) = (hex(h), hex(l)) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c as char);
                } else {
                    out.push_str(&format!("%{c:02X}"));
                }
                i += 3;
                continue;
            }
        }
        let len = s[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&s[i..i + len]);
        i += len;
    }
    out
}

/// An absolute path without its `.` and `..` segments (RFC 3986 §5.2.4).
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            other => {
                out.push(other);
                continue;
            }
        }
        if last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}
