//! `agentid org` and `agentid key`: organizations, their plans and their API keys.

use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};

use super::operator::KeyFileArgs;
use super::{open, CliResult, DbArgs};
use crate::domain::{ApiKeyKind, KeyMode, Millis, OrgId, OrgLimits, Plan};
use crate::engine::{admin, hash_key};
use crate::keys::KeyRing;
use crate::store::SharedStore;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum PlanArg {
    Free,
    Developer,
    Growth,
    Enterprise,
}

impl From<PlanArg> for Plan {
    fn from(p: PlanArg) -> Plan {
        match p {
            PlanArg::Free => Plan::Free,
            PlanArg::Developer => Plan::Developer,
            PlanArg::Growth => Plan::Growth,
            PlanArg::Enterprise => Plan::Enterprise,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum KindArg {
    Secret,
    Publishable,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ModeArg {
    Live,
    Test,
}

#[derive(Debug, Subcommand)]
pub(crate) enum OrgCommand {
    /// Create an organization and print it with its four keys (shown once) as JSON.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long, value_enum)]
        plan: PlanArg,
        /// Verify calls per minute (enterprise only, and required there).
        #[arg(long)]
        verify_limit: Option<u32>,
        /// Calls per minute to all other endpoints (enterprise only, and required there).
        #[arg(long)]
        other_limit: Option<u32>,
        /// Longest token lifetime in seconds, at most one year (enterprise only) [default: the plan's]
        #[arg(long)]
        max_expiry_seconds: Option<u64>,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print every organization as JSON: org_id, name, plan, created_at.
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Change an organization's plan or limits (running servers see it within 10 s).
    SetLimits {
        #[arg(long)]
        org: String,
        /// New plan [default: keep the current one]
        #[arg(long, value_enum)]
        plan: Option<PlanArg>,
        /// Verify calls per minute (enterprise only) [default: keep the current one]
        #[arg(long)]
        verify_limit: Option<u32>,
        /// Calls per minute to all other endpoints (enterprise only) [default: keep the current one]
        #[arg(long)]
        other_limit: Option<u32>,
        /// Longest token lifetime in seconds, at most one year (enterprise only) [default: keep the current one]
        #[arg(long)]
        max_expiry_seconds: Option<u64>,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Print an organization's keys as JSON: id, name, kind, mode, the key's prefix and last
    /// four characters (never the key), created_at, last_used_at (to the minute), disabled.
    List {
        #[arg(long)]
        org: String,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Create one more key for an organization and print it (shown once); its id goes to
    /// standard error.
    Create {
        #[arg(long)]
        org: String,
        /// What you call it (`key list` shows it): up to 100 characters.
        #[arg(long)]
        name: Option<String>,
        #[arg(long, value_enum)]
        kind: KindArg,
        #[arg(long, value_enum)]
        mode: ModeArg,
        #[command(flatten)]
        keys: KeyFileArgs,
        #[command(flatten)]
        db: DbArgs,
    },
    /// Disable a key for good: by its id (`key list` shows it), for a key you no longer have,
    /// or by the key itself, read from standard input so that it stays out of shell history
    /// and process listings: `echo "$KEY" | agentid key disable`.
    Disable {
        #[command(flatten)]
        db: DbArgs,
        /// The key's id (`key_…`), as `agentid key list` shows it.
        #[arg(long)]
        id: Option<String>,
        /// Not taken: a key given here would be in the shell's history (read from stdin).
        #[arg(hide = true)]
        key: Option<String>,
    },
}

/// The fleet's key file, which seals organizations and keys: as `serve` takes it, so that on
/// a database that records no signing key yet it is made (if missing) and recorded here.
async fn sealing_key(store: &SharedStore, keys: &KeyFileArgs) -> Result<KeyRing, Box<dyn std::error::Error>> {
    let (root, created) = admin::fleet_signing_key(store, &keys.signing_key_file).await?;
    if created {
        eprintln!(
            "agentid: made the fleet's signing key file {} (every instance starts with it)",
            keys.signing_key_file.display()
        );
    }
    Ok(root)
}

pub(super) async fn org(cmd: OrgCommand) -> CliResult {
    match cmd {
        OrgCommand::List { db } => {
            let store = open(&db).await?;
            let orgs: Vec<serde_json::Value> = store
                .list_orgs()
                .await?
                .into_iter()
                .map(|o| {
                    serde_json::json!({
                        "org_id": o.id, "name": o.name, "plan": o.plan.as_str(), "created_at": o.created_at,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string(&orgs)?);
            Ok(ExitCode::SUCCESS)
        }
        OrgCommand::Create {
            name,
            plan,
            verify_limit,
            other_limit,
            max_expiry_seconds,
            keys,
            db,
        } => {
            let plan = Plan::from(plan);
            let limits = OrgLimits::resolve(plan, verify_limit, other_limit, max_expiry_seconds)?;
            let name = crate::domain::Name::parse(&name)?;
            let store = open(&db).await?;
            let root = sealing_key(&store, &keys).await?;
            let created = admin::create_org(&store, &root, name.as_str(), plan, limits).await?;
            println!("{}", serde_json::to_string(&created)?);
            Ok(ExitCode::SUCCESS)
        }
        OrgCommand::SetLimits {
            org,
            plan,
            verify_limit,
            other_limit,
            max_expiry_seconds,
            keys,
            db,
        } => {
            let store = open(&db).await?;
            let root = sealing_key(&store, &keys).await?;
            let change = admin::LimitChange {
                plan: plan.map(Plan::from),
                verify_limit,
                other_limit,
                max_expiry_seconds,
            };
            let record = admin::set_limits(&store, &root, &org, change).await?;
            println!(
                "{}",
                serde_json::json!({
                    "org_id": record.id, "plan": record.plan.as_str(),
                    "verify_limit": record.limits().verify_per_minute,
                    "other_limit": record.limits().other_per_minute,
                    "max_expiry_seconds": record.limits().max_expiry_seconds,
                })
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub(super) async fn key(cmd: KeyCommand) -> CliResult {
    match cmd {
        KeyCommand::List { org, db } => {
            let store = open(&db).await?;
            let found = match OrgId::parse(&org) {
                Some(id) => store.get_org(&id).await?.map(|o| o.id),
                None => None,
            };
            let Some(id) = found else {
                eprintln!("agentid: no organization {org} (`agentid org list` shows them)");
                return Ok(ExitCode::FAILURE);
            };
            println!("{}", serde_json::to_string(&store.list_keys(&id).await?)?);
            Ok(ExitCode::SUCCESS)
        }
        KeyCommand::Create {
            org,
            name,
            kind,
            mode,
            keys,
            db,
        } => {
            let kind = match kind {
                KindArg::Secret => ApiKeyKind::Secret,
                KindArg::Publishable => ApiKeyKind::Publishable,
            };
            let mode = match mode {
                ModeArg::Live => KeyMode::Live,
                ModeArg::Test => KeyMode::Test,
            };
            let store = open(&db).await?;
            let root = sealing_key(&store, &keys).await?;
            match admin::create_key(&store, &root, &org, kind, mode, name.as_deref()).await? {
                Some((key, id)) => {
                    println!("{key}");
                    eprintln!("agentid: created {id}");
                    Ok(ExitCode::SUCCESS)
                }
                None => {
                    eprintln!("agentid: no organization {org}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        KeyCommand::Disable { db, id, key } => {
            if let Some(id) = id {
                let store = open(&db).await?;
                return Ok(if store.disable_key_id(&id, Millis::now()).await? {
                    println!("disabled (running servers refuse it within 10 s)");
                    ExitCode::SUCCESS
                } else {
                    eprintln!("agentid: no key {id} (`agentid key list --org …` shows them)");
                    ExitCode::FAILURE
                });
            }
            if key.is_some() {
                return Err(
                    "the key is read from standard input, not from the command line (where \
                     shell history and process listings would keep it): \
                     echo \"$KEY\" | agentid key disable"
                        .into(),
                );
            }
            let mut line = String::new();
            std::io::stdin().read_line(&mut line)?;
            let store = open(&db).await?;
            if store.disable_key(&hash_key(line.trim()), Millis::now()).await? {
                println!("disabled (running servers refuse it within 10 s)");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("agentid: no such key");
                Ok(ExitCode::FAILURE)
            }
        }
    }
}
