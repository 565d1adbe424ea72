//! What a receiver tells OAuth clients about itself (RFC 9728, protected resource metadata):
//! its resource identifier, that the verifier's agentid service issues its tokens, the scopes
//! it knows, and how a token is sent. An MCP client reads it to find where to get a token.

use serde_json::{json, Value};

use super::{Error, Verifier};

/// Where RFC 9728 puts the document: between the resource's host and its path.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The protected resource metadata of one resource.
///
/// ```
/// # fn f(verifier: &agentid_verifier::Verifier) -> Result<(), agentid_verifier::Error> {
/// use agentid_verifier::ResourceMetadata;
/// let metadata = ResourceMetadata::new(verifier, "https://api.example/mcp")?.scopes_supported(["tools:call"]);
/// assert_eq!(metadata.path(), "/.well-known/oauth-protected-resource/mcp");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceMetadata {
    resource: String,
    authorization_server: String,
    scopes_supported: Vec<String>,
    path: String,
    url: String,
}

impl ResourceMetadata {
    /// The metadata of `resource` (an `https://` or `http://` URI without a fragment, else
    /// `MISCONFIGURED`), whose tokens `verifier`'s service issues.
    pub fn new(verifier: &Verifier, resource: &str) -> Result<Self, Error> {
        let rest = resource
            .strip_prefix("https://")
            .or_else(|| resource.strip_prefix("http://"))
            .filter(|r| !r.is_empty() && !r.starts_with('/') && !resource.contains('#'))
            .ok_or_else(|| {
                Error::Misconfigured(format!(
                    "resource {resource:?} is not an http(s) URI without a fragment"
                ))
            })?;
        let cut = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(cut);
        let path = if path == "/" { "" } else { path };
        let origin = &resource[..resource.len() - rest.len() + authority.len()];
        let well_known = format!("{WELL_KNOWN}{path}");
        Ok(ResourceMetadata {
            resource: resource.to_owned(),
            authorization_server: verifier.base_url().to_owned(),
            scopes_supported: Vec::new(),
            url: format!("{origin}{well_known}"),
            path: well_known,
        })
    }

    /// The scopes this receiver knows (`scopes_supported`).
    pub fn scopes_supported<I: IntoIterator<Item = S>, S: Into<String>>(mut self, scopes: I) -> Self {
        self.scopes_supported = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// The path it is served at, on the resource's own origin.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Its URL, as a challenge names it (`resource_metadata="…"`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The JSON document.
    pub fn document(&self) -> Value {
        let mut doc = json!({
            "resource": self.resource,
            "authorization_servers": [self.authorization_server],
            "bearer_methods_supported": ["header"],
            "dpop_signing_alg_values_supported": ["EdDSA", "ES256"],
        });
        if !self.scopes_supported.is_empty() {
            doc["scopes_supported"] = json!(self.scopes_supported);
        }
        doc
    }
}
