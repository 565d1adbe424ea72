//! The operator's commands: `migrate`, `signing-key` (rotation) and `domain` (who holds an
//! issuer domain).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::{may_create, open, CliResult, DbArgs};
use crate::config;
use crate::engine::admin;
use crate::store::{self, SharedStore, StoreOptions};

#[derive(Debug, Subcommand)]
pub(crate) enum SigningKeyCommand {
    /// Print every signing key as JSON: kid, state (next, active, replaced, retired, unvouched),
    /// created_at, activates_at.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// The key file every instance starts with (a key it does not vouch for is listed
        /// as unvouched: it counts nowhere).
        #[arg(
            long,
            env = "AGENTID_SIGNING_KEY_FILE",
            default_value = config::DEFAULT_SIGNING_KEY_FILE
        )]
        signing_key_file: PathBuf,
    },
    /// Add a signing key: in JWKS at once, signing once --publish-for has passed. The key it
    /// replaces keeps validating until its last token expires. Running instances follow
    /// within 10 s. The private key is stored sealed under the signing key file.
    Rotate {
        #[command(flatten)]
        db: DbArgs,
        /// How long the new key is published before it signs (0s: at once; receivers that
        /// cached JWKS then meet a kid they have not seen).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        publish_for: Duration,
        /// The key file every instance starts with (it seals the new key).
        #[arg(
            long,
            env = "AGENTID_SIGNING_KEY_FILE",
            default_value = config::DEFAULT_SIGNING_KEY_FILE
        )]
        signing_key_file: PathBuf,
    },
    /// Retire a key now: every token it signed is TOKEN_INVALID online, and it leaves JWKS.
    /// Refused for the only active key.
    Retire {
        /// The key's kid (a kid may begin with '-', which is read as the kid, not a flag).
        #[arg(allow_hyphen_values = true)]
        kid: String,
        #[command(flatten)]
        db: DbArgs,
        /// The key file every instance starts with (which keys are active is worked out among
        /// those it vouches for).
        #[arg(
            long,
            env = "AGENTID_SIGNING_KEY_FILE",
            default_value = config::DEFAULT_SIGNING_KEY_FILE
        )]
        signing_key_file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum DomainCommand {
    /// Grant an organization an issuer domain with no challenge (`method: operator`: the
    /// name and every name below it). A name another organization holds needs --force, and
    /// then revokes that organization's agents under it.
    Approve {
        /// The organization: its org_id, or a name only it has.
        #[arg(long)]
        org: String,
        domain: String,
        /// Take the name from the organization that holds it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print who holds which name as JSON: verified names (with their method), pending claims (with
    /// --org), and names agents use that none of their organizations holds (`unverified`).
    List {
        #[arg(long)]
        org: Option<String>,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// End an organization's holding (or claim) of a name. Its agents keep their tokens until
    /// they expire, and get no new ones.
    Release {
        #[arg(long)]
        org: String,
        domain: String,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

/// The key file every instance starts with: it seals (and vouches for) who holds a name.
#[derive(Debug, Args)]
pub(crate) struct KeyFileArgs {
    #[arg(
        long,
        env = "AGENTID_SIGNING_KEY_FILE",
        default_value = config::DEFAULT_SIGNING_KEY_FILE
    )]
    pub(crate) signing_key_file: PathBuf,
}

pub(super) async fn migrate(db: DbArgs, grant: Option<String>) -> CliResult {
    let url = &db.database_url;
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        if let Some(role) = &grant {
            if !store::valid_role(role) {
                return Err(format!("--grant: {role:?} is not a plain role name").into());
            }
        }
        store::migrate_postgres(url, grant.as_deref()).await?;
    } else {
        if grant.is_some() {
            return Err("--grant is for PostgreSQL (SQLite has no roles)".into());
        }
        let opts = StoreOptions {
            create: may_create(url),
            ..StoreOptions::default()
        };
        store::connect(url, &opts).await?.close().await;
    }
    println!(
        "migrated{}",
        grant.map_or(String::new(), |r| format!(
            "; granted role {r} what the service needs"
        ))
    );
    Ok(ExitCode::SUCCESS)
}

/// What every `agentid domain` command starts from: the database, the fleet's key file
/// (which seals and vouches for who holds a name) and, when named, the organization.
pub(super) async fn operator(
    db: &DbArgs,
    keys: &KeyFileArgs,
    org: Option<&str>,
) -> Result<(SharedStore, crate::keys::KeyRing, Option<crate::store::OrgRecord>), Box<dyn std::error::Error>>
{
    use crate::engine::grants;
    let store = open(db).await?;
    let root = grants::fleet_key_file(&store, &keys.signing_key_file).await?;
    let org = match org {
        Some(o) => Some(grants::find_org(&store, o).await?),
        None => None,
    };
    Ok((store, root, org))
}

pub(super) async fn domain(cmd: DomainCommand) -> CliResult {
    use crate::engine::grants;
    match cmd {
        DomainCommand::Approve {
            org,
            domain,
            force,
            keys,
            db,
        } => {
            let (store, root, org) = operator(&db, &keys, Some(&org)).await?;
            let org = org.expect("named");
            let held = grants::approve(&store, &root, &org, &domain, force).await?;
            println!(
                "{}",
                serde_json::json!({
                    "domain": held.holding.domain, "org_id": org.id, "method": held.holding.method.as_str(),
                    "verified_at": held.holding.at,
                    "taken_from": held.ended.iter().filter(|h| org.id != *h.org_id)
                        .map(|h| serde_json::json!({"domain": h.domain, "org_id": h.org_id})).collect::<Vec<_>>(),
                    "revoked_agents": held.revoked.len(),
                })
            );
        }
        DomainCommand::List { org, keys, db } => {
            let (store, root, org) = operator(&db, &keys, org.as_deref()).await?;
            let listed = grants::list(&store, &root, org.as_ref()).await?;
            println!("{}", serde_json::to_string(&listed)?);
        }
        DomainCommand::Release {
            org,
            domain,
            keys,
            db,
        } => {
            let (store, root, org) = operator(&db, &keys, Some(&org)).await?;
            grants::release(&store, &root, &org.expect("named"), &domain).await?;
            println!("released (its agents keep their tokens until they expire, and get no new ones)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The key file at `path`, which must exist.
fn key_file(path: &std::path::Path) -> Result<crate::keys::KeyRing, Box<dyn std::error::Error>> {
    crate::keys::KeyRing::load(path)?
        .ok_or_else(|| admin::AdminError::NoKeyFile(path.display().to_string()).into())
}

pub(super) async fn signing_key(cmd: SigningKeyCommand) -> CliResult {
    match cmd {
        SigningKeyCommand::List { db, signing_key_file } => {
            let store = open(&db).await?;
            let root = key_file(&signing_key_file)?;
            println!(
                "{}",
                serde_json::to_string(&admin::signing_keys(&store, &root).await?)?
            );
        }
        SigningKeyCommand::Rotate {
            db,
            publish_for,
            signing_key_file,
        } => {
            let root = key_file(&signing_key_file)?;
            let store = open(&db).await?;
            let view = admin::rotate_signing_key(&store, &root, &signing_key_file, publish_for).await?;
            println!("{}", serde_json::to_string(&view)?);
        }
        SigningKeyCommand::Retire {
            kid,
            db,
            signing_key_file,
        } => {
            let store = open(&db).await?;
            let root = key_file(&signing_key_file)?;
            admin::retire_signing_key(&store, &root, &kid).await?;
            println!("retired {kid} (running instances refuse its tokens within 10 s)");
        }
    }
    Ok(ExitCode::SUCCESS)
}
