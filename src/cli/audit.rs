//! `agentid audit verify` and `agentid audit witness`: checking the log, and holding it to
//! "only ever grew".

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use super::{open, CliResult, DbArgs};
use crate::config;
use crate::engine::{admin, EngineConfig};

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Recompute everything the audit log claims from its records: every hash chain, the
    /// derived columns and per-agent rows, the Merkle trees, and the root at every stored
    /// checkpoint (and their signatures), and at every checkpoint in --checkpoints. Prints each
    /// failure with its ledger and seq; exit 0 only when everything holds.
    Verify {
        #[command(flatten)]
        db: DbArgs,
        /// A file of signed checkpoints (one or more notes, as `GET /v1/log/checkpoint` answers
        /// them), or a folder of such files (a witness's state folder, say).
        #[arg(long)]
        checkpoints: Option<PathBuf>,
        /// The log key (as `/.well-known/log-key` serves it) [default: derived from the
        /// signing key file and the public URL]
        #[arg(long)]
        log_key: Option<String>,
        /// The service's signing key file, from which the log key is derived.
        #[arg(
            long,
            env = "AGENTID_SIGNING_KEY_FILE",
            default_value = config::DEFAULT_SIGNING_KEY_FILE
        )]
        signing_key_file: PathBuf,
        /// The service's public URL (its host names the log key) [default: http://127.0.0.1:8080]
        #[arg(long, env = "AGENTID_PUBLIC_URL")]
        public_url: Option<String>,
        /// Check without the key file (with --log-key): the blocks' seals, the signing keys
        /// and the issuer-domain events are then not checked. Without this flag a missing
        /// key file is an error (exit 2), never a quieter check.
        #[arg(long)]
        without_key_file: bool,
        #[command(flatten)]
        staleness: StalenessArgs,
    },
    /// Check, from your own machine, that the service's log of your ledger only grows: fetch
    /// its checkpoint, verify it, verify a consistency proof from the one saved last time, save
    /// it. Run it from cron. Exit 1 when the log shrank, forked or cannot prove it only grew;
    /// 2 when the check could not be made.
    Witness {
        /// The service's base URL.
        #[arg(long)]
        url: String,
        /// Not taken: a key given here would be in every process listing. A secret key of
        /// your organization (its mode picks the ledger) comes in AGENTID_WITNESS_KEY.
        #[arg(long, hide = true)]
        key: Option<String>,
        /// Folder that keeps the last checkpoint and the pinned log key (one per ledger).
        #[arg(long)]
        state: PathBuf,
        /// The log key [default: /.well-known/log-key at the first run, pinned after]
        #[arg(long)]
        log_key: Option<String>,
        #[command(flatten)]
        staleness: StalenessArgs,
    },
}

/// When records that no checkpoint covers are an alarm.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StalenessArgs {
    /// The service's checkpoint interval, in milliseconds (as `serve` takes it).
    #[arg(long, env = "AGENTID_CHECKPOINT_INTERVAL_MS", default_value_t = EngineConfig::default().checkpoint_interval.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub(crate) checkpoint_interval_ms: u64,
    /// Fail when a record has gone uncovered by any checkpoint for more than this many
    /// checkpoint intervals (the checkpointer stopped, or was stopped).
    #[arg(long, env = "AGENTID_STALE_AFTER_INTERVALS", default_value_t = 6,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) stale_after_intervals: u32,
}

/// Where `audit witness` reads its API key.
const WITNESS_KEY: &str = "AGENTID_WITNESS_KEY";

/// Runs `agentid audit …`: exit 0 when the log holds, 1 when it broke its promise, 2 when
/// it could not be checked (a cron job missing its settings raises no false alarm).
pub(super) async fn run(cmd: AuditCommand) -> CliResult {
    match checked(cmd).await {
        Ok(code) => Ok(code),
        // A stored value that does not read as the service writes it: the log's rows were
        // changed, which is the alarm (1), not a check that could not be made.
        Err(e) if is_corrupt(e.as_ref()) => {
            println!("FAIL    {}", super::one_line(&e.to_string()));
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!(
                "agentid audit: could not check: {}",
                super::one_line(&e.to_string())
            );
            Ok(ExitCode::from(2))
        }
    }
}

fn is_corrupt(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<crate::store::StoreError>(),
        Some(crate::store::StoreError::Corrupt(_))
    )
}

async fn checked(cmd: AuditCommand) -> CliResult {
    match cmd {
        AuditCommand::Verify {
            db,
            checkpoints,
            log_key,
            signing_key_file,
            public_url,
            without_key_file,
            staleness,
        } => {
            verify(
                db,
                checkpoints,
                log_key,
                (signing_key_file, without_key_file),
                public_url,
                staleness.limit()?,
            )
            .await
        }
        AuditCommand::Witness {
            url,
            key,
            state,
            log_key,
            staleness,
        } => {
            if key.is_some() {
                return Err(
                    "the key is read from AGENTID_WITNESS_KEY, not from the command line \
                     (where process listings and shell history would keep it)"
                        .into(),
                );
            }
            let key = std::env::var(WITNESS_KEY)
                .map_err(|_| format!("{WITNESS_KEY} must hold a secret key of your organization"))?;
            witness(crate::witness::Witness {
                url,
                key,
                state,
                log_key,
                stale_after: staleness.limit()?,
            })
            .await
        }
    }
}

impl StalenessArgs {
    /// The interval times the count; an error when that is past any clock (over a century).
    fn limit(&self) -> Result<Duration, String> {
        const MAX: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        Duration::from_millis(self.checkpoint_interval_ms.max(1))
            .checked_mul(self.stale_after_intervals.max(1))
            .filter(|d| *d <= MAX)
            .ok_or_else(|| {
                "--checkpoint-interval-ms times --stale-after-intervals is over a century".to_owned()
            })
    }
}

pub(super) async fn verify(
    db: DbArgs,
    checkpoints: Option<PathBuf>,
    log_key: Option<String>,
    (signing_key_file, without_key_file): (PathBuf, bool),
    public_url: Option<String>,
    stale_after: Duration,
) -> CliResult {
    use agentid_engine::transparency::check as logcheck;
    let root = crate::keys::KeyRing::load(&signing_key_file)?;
    if root.is_none() && !without_key_file && log_key.is_some() {
        return Err(format!(
            "no signing key file at {}: the blocks' seals, the signing keys and the issuer-domain \
             events are checked with it (give --signing-key-file, or --without-key-file to check \
             the rest knowingly)",
            signing_key_file.display()
        )
        .into());
    }
    let verifier = match log_key {
        Some(k) => crate::tlog::note::LogVerifier::parse(&k)?,
        None => {
            let Some(keys) = &root else {
                return Err(format!(
                    "no signing key file at {} to derive the log key from: give --log-key (as \
                     /.well-known/log-key serves it) or --signing-key-file",
                    signing_key_file.display()
                )
                .into());
            };
            let url = public_url.unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
            let name = agentid_engine::transparency::checkpointer::log_key_name(crate::app::host_of(&url));
            keys.log_key(&name).verifier().clone()
        }
    };
    let given = match &checkpoints {
        Some(path) => crate::witness::notes_in(path)?,
        None => Vec::new(),
    };
    let store = open(&db).await?;
    if root.is_none() {
        println!(
            "note: no signing key file at {}: the blocks' seals are not checked",
            signing_key_file.display()
        );
    }
    let report = logcheck::check(&store, &verifier, root.as_ref(), &given, stale_after).await?;
    for l in &report.ledgers {
        let failed = report.failures.iter().filter(|f| f.ledger == l.ledger).count();
        let status = if failed == 0 { "ok     " } else { "FAILED " };
        println!(
            "{status} {}: {} records, {} checkpoints recomputed{}",
            l.ledger,
            l.records,
            l.checkpoints,
            if failed == 0 {
                String::new()
            } else {
                format!(", {failed} failures")
            }
        );
    }
    for f in &report.failures {
        println!("FAIL    {f}");
    }
    if !given.is_empty() {
        println!(
            "checked {} given checkpoints from {}",
            given.len(),
            checkpoints
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        );
    }
    // The signing keys: every recorded key must be one the key file vouches for.
    let unvouched = match &root {
        Some(root) => {
            let unvouched = admin::unvouched_signing_keys(&store, root).await?;
            if unvouched.is_empty() {
                println!("ok      signing keys: every recorded key is vouched for by the key file");
            }
            for u in &unvouched {
                println!("FAIL    {u}");
            }
            unvouched.len()
        }
        None => {
            println!(
                "skipped signing keys: no key file at {} to check them with",
                signing_key_file.display()
            );
            0
        }
    };
    // Who holds which issuer domain: every event vouched for, none missing, one holder a name.
    let holdings = match &root {
        Some(root) => {
            let failures = crate::engine::grants::check_holdings(&store, root).await?;
            if failures.is_empty() {
                println!("ok      issuer domains: every holding event is vouched for by the key file");
            }
            for f in &failures {
                println!("FAIL    {f}");
            }
            failures.len()
        }
        None => 0,
    };
    Ok(if report.ok() && unvouched == 0 && holdings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub(super) async fn witness(w: crate::witness::Witness) -> CliResult {
    use crate::witness::WitnessError;
    match tokio::task::spawn_blocking(move || w.run()).await? {
        Ok(seen) => {
            match seen.previous {
                Some(p) => println!(
                    "ok: {} holds {} records, and extends the {p} seen before",
                    super::one_line(&seen.origin),
                    seen.size
                ),
                None => println!(
                    "ok: {} holds {} records (first checkpoint saved)",
                    super::one_line(&seen.origin),
                    seen.size
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(WitnessError::Log(m)) => {
            eprintln!("agentid audit witness: ALERT: {}", super::one_line(&m));
            Ok(ExitCode::from(1))
        }
        Err(WitnessError::Check(m)) => {
            eprintln!("agentid audit witness: cannot check: {}", super::one_line(&m));
            Ok(ExitCode::from(2))
        }
    }
}
