//! The SQL of `crate::agents` for one backend: `DB` is its database.

use super::agent_rows::insert_agent;
use super::holdings::check_issuer;
use super::places::allocate;
use super::revoke::revoke_in;
use crate::agent_rows::{insert_agent_sql, place, scopes_json, AgentRow, AGENT_COLUMNS};
use crate::domains::DomainRules;
use crate::places::PlaceDraw;
use crate::sql::{decode, Backend, SqlStore};
use crate::{AgentRecord, Revocation, RevokedSince, StoreError, StoreFuture};
use agentid_core::domain::holding::NotCovered;
use agentid_core::domain::{AgentId, IssuerDomain, KeyMode, Ledger, Millis, OrgId, StatusPlace};

use crate::agents::{AgentStore, KeyBinding, RevocationRow};

use super::DB;

impl AgentStore for SqlStore<DB> {
    fn revocations_of<'a>(&'a self, ledger: &'a Ledger) -> StoreFuture<'a, Vec<(String, Millis)>> {
        Box::pin(async move {
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT id, revoked_at FROM agents WHERE org_id = $1 AND mode = $2 AND revoked_at IS NOT NULL \
                 ORDER BY COALESCE(revoked_epoch, 0), revoked_at, id",
            )
            .bind(ledger.org_id.as_str())
            .bind(ledger.mode.as_str())
            .fetch_all(&mut *self.conn().await?)
            .await?;
            Ok(rows.into_iter().map(|(id, at)| (id, Millis(at))).collect())
        })
    }

    fn insert_agent_placed<'a>(
        &'a self,
        a: &'a AgentRecord,
        placing: &'a PlaceDraw,
        issuer: Option<&'a dyn DomainRules>,
    ) -> StoreFuture<'a, Result<(StatusPlace, u64), NotCovered>> {
        // A transaction that failed before its COMMIT wrote nothing: during an outage it
        // runs again (a place drawn anew), until the store's wait ends. One whose COMMIT
        // broke is found out by the agent's id, its primary key: there, it committed (its
        // place is read back); not there, it runs again, and the key lets one run hold it.
        Box::pin(async move {
            let mut unknown = None;
            for _ in 0..3 {
                let tried = self
                    .outage
                    .ride_out(move || async move {
                        let mut tx = self.exclusive().await?;
                        if let Some(rules) = issuer {
                            if let Err(refused) =
                                check_issuer(&mut tx, rules, a.org_id.as_str(), a.issuer_domain.as_str())
                                    .await?
                            {
                                return Ok(Err(refused));
                            }
                        }
                        let (place, size) = allocate(&mut tx, placing, a.created_at).await?;
                        let placed = AgentRecord {
                            status: Some(place.clone()),
                            ..a.clone()
                        };
                        let sql = insert_agent_sql();
                        let scopes = scopes_json(&placed.scopes);
                        insert_agent(&sql, &placed, &scopes).execute(&mut *tx).await?;
                        self.outage.commit(tx).await?;
                        Ok(Ok((place, size)))
                    })
                    .await;
                let e = match tried {
                    Err(e @ StoreError::OutcomeUnknown(_)) => e,
                    // A conflict on the id after an unknown outcome: the first run is there.
                    Err(StoreError::Conflict(_)) if unknown.is_some() => {
                        StoreError::OutcomeUnknown("conflict".into())
                    }
                    other => return other,
                };
                // The agent's place and its list's size, if the agent is stored.
                let placed = || async {
                    let row: Option<(Option<String>, Option<i64>, Option<i64>)> = sqlx::query_as(
                        "SELECT a.status_list, a.status_idx, l.size FROM agents a \
                         LEFT JOIN status_lists l ON l.id = a.status_list WHERE a.id = $1",
                    )
                    .bind(a.id.as_str())
                    .fetch_optional(&mut *self.conn().await?)
                    .await?;
                    let Some((list, idx, size)) = row else {
                        return Ok(None);
                    };
                    match (place(list, idx)?, size) {
                        (Some(place), Some(size)) if size > 0 => Ok(Some((place, size as u64))),
                        _ => Err(StoreError::Corrupt(format!("agent {} has no status place", a.id))),
                    }
                };
                match self.outage.ride_out(placed).await {
                    Ok(Some(found)) => return Ok(Ok(found)),
                    Ok(None) => unknown = Some(e),
                    Err(_) => return Err(e),
                }
            }
            Err(unknown.unwrap_or_else(|| StoreError::OutcomeUnknown("registration".into())))
        })
    }

    fn status_lists(&self) -> StoreFuture<'_, Vec<(String, u64)>> {
        Box::pin(async move {
            let rows: Vec<(String, i64)> = sqlx::query_as("SELECT id, size FROM status_lists ORDER BY id")
                .fetch_all(&mut *self.conn().await?)
                .await?;
            rows.into_iter()
                .map(|(id, size)| {
                    u64::try_from(size)
                        .map(|n| (id, n))
                        .map_err(|_| StoreError::Corrupt("status list size".into()))
                })
                .collect()
        })
    }

    fn get_agent<'a>(&'a self, id: &'a AgentId) -> StoreFuture<'a, Option<AgentRecord>> {
        Box::pin(async move {
            let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1");
            let row: Option<AgentRow> = sqlx::query_as(&sql)
                .bind(id.as_str())
                .fetch_optional(&mut *self.conn().await?)
                .await?;
            row.map(AgentRow::into_record).transpose()
        })
    }

    fn keyed_agents<'a>(
        &'a self,
        issuer_domain: &'a IssuerDomain,
        limit: u32,
    ) -> StoreFuture<'a, Vec<AgentRecord>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE issuer_domain = $1 AND mode = $2 \
                 AND revoked_at IS NULL AND jwk IS NOT NULL ORDER BY id LIMIT $3"
            );
            let rows: Vec<AgentRow> = sqlx::query_as(&sql)
                .bind(issuer_domain.as_str())
                .bind(KeyMode::Live.as_str())
                .bind(i64::from(limit))
                .fetch_all(&mut *self.conn().await?)
                .await?;
            rows.into_iter().map(AgentRow::into_record).collect()
        })
    }

    fn keyed_agent<'a>(
        &'a self,
        issuer_domain: &'a IssuerDomain,
        jkt: &'a str,
    ) -> StoreFuture<'a, Option<AgentRecord>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE jkt = $1 AND issuer_domain = $2 AND mode = $3 \
                 AND revoked_at IS NULL AND jwk IS NOT NULL ORDER BY id LIMIT 1"
            );
            let row: Option<AgentRow> = sqlx::query_as(&sql)
                .bind(jkt)
                .bind(issuer_domain.as_str())
                .bind(KeyMode::Live.as_str())
                .fetch_optional(&mut *self.conn().await?)
                .await?;
            row.map(AgentRow::into_record).transpose()
        })
    }

    fn issuer_agent_orgs<'a>(
        &'a self,
        issuer_domain: &'a IssuerDomain,
        limit: u32,
    ) -> StoreFuture<'a, Vec<OrgId>> {
        Box::pin(async move {
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT org_id FROM agents WHERE issuer_domain = $1 AND mode = $2 \
                 GROUP BY org_id ORDER BY MAX(created_at) DESC, org_id LIMIT $3",
            )
            .bind(issuer_domain.as_str())
            .bind(KeyMode::Live.as_str())
            .bind(i64::from(limit))
            .fetch_all(&mut *self.conn().await?)
            .await?;
            rows.iter()
                .map(|(id,)| crate::sql::decode("organization", id, OrgId::parse))
                .collect()
        })
    }

    fn list_agents<'a>(
        &'a self,
        org_id: &'a OrgId,
        mode: KeyMode,
        before: Option<&'a AgentId>,
        limit: Option<u32>,
    ) -> StoreFuture<'a, Vec<AgentRecord>> {
        Box::pin(async move {
            let below = if before.is_some() { "AND id < $4 " } else { "" };
            let sql = format!(
                "SELECT {AGENT_COLUMNS} FROM agents WHERE org_id = $1 AND mode = $2 {below}\
                 ORDER BY id DESC LIMIT $3"
            );
            let mut q = sqlx::query_as(&sql)
                .bind(org_id.as_str())
                .bind(mode.as_str())
                // No limit: the largest one both backends take.
                .bind(limit.map_or(i64::MAX, i64::from));
            if let Some(b) = before {
                q = q.bind(b.as_str());
            }
            let rows: Vec<AgentRow> = q.fetch_all(&mut *self.conn().await?).await?;
            rows.into_iter().map(AgentRow::into_record).collect()
        })
    }

    fn scan_agents<'a>(&'a self, after_id: &'a str, limit: u32) -> StoreFuture<'a, Vec<AgentRecord>> {
        Box::pin(async move {
            let sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id > $1 ORDER BY id LIMIT $2");
            let rows: Vec<AgentRow> = sqlx::query_as(&sql)
                .bind(after_id)
                .bind(i64::from(limit))
                .fetch_all(&mut *self.conn().await?)
                .await?;
            rows.into_iter().map(AgentRow::into_record).collect()
        })
    }

    fn renew_token<'a>(
        &'a self,
        id: &'a AgentId,
        issued_at: Millis,
        expires_at: Millis,
        binding: KeyBinding<'a>,
        issuer: Option<&'a dyn DomainRules>,
    ) -> StoreFuture<'a, Result<bool, NotCovered>> {
        Box::pin(self.outage.ride_out(move || async move {
            // A new binding is written over the one read, or over itself: an attempt tried
            // again after its write committed unseen finds its own.
            let renew = match binding.new {
                None => sqlx::query(
                    "UPDATE agents SET issued_at = $2, expires_at = $3 \
                     WHERE id = $1 AND revoked_at IS NULL AND key_mac = $4",
                )
                .bind(id.as_str())
                .bind(issued_at.0)
                .bind(expires_at.0)
                .bind(&binding.read[..]),
                Some(new) => sqlx::query(
                    "UPDATE agents SET issued_at = $2, expires_at = $3, jkt = $4, jwk = $5, \
                     key_mac = $6, key_sealed_at = $7 \
                     WHERE id = $1 AND revoked_at IS NULL AND (key_mac = $8 OR key_mac = $6)",
                )
                .bind(id.as_str())
                .bind(issued_at.0)
                .bind(expires_at.0)
                .bind(new.jkt)
                .bind(new.jwk)
                .bind(&new.mac[..])
                .bind(new.sealed_at.0)
                .bind(&binding.read[..]),
            };
            let Some(rules) = issuer else {
                return Ok(Ok(DB::rows_affected(
                    &renew.execute(&mut *self.conn().await?).await?,
                ) == 1));
            };
            let mut tx = self.exclusive().await?;
            let agent: Option<(String, String)> =
                sqlx::query_as("SELECT org_id, issuer_domain FROM agents WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some((org_id, domain)) = agent else {
                return Ok(Ok(false));
            };
            if let Err(refused) = check_issuer(&mut tx, rules, &org_id, &domain).await? {
                return Ok(Err(refused));
            }
            let done = renew.execute(&mut *tx).await?;
            crate::sql::commit(tx).await?;
            Ok(Ok(DB::rows_affected(&done) == 1))
        }))
    }

    fn use_assertion<'a>(&'a self, key: &'a str, expires_at: Millis) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "INSERT INTO client_assertions (key, expires_at) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
            )
            .bind(key)
            .bind(expires_at.0)
            .execute(&mut *self.conn().await?)
            .await?;
            Ok(DB::rows_affected(&done) == 1)
        })
    }

    fn release_assertion<'a>(&'a self, key: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("DELETE FROM client_assertions WHERE key = $1")
                .bind(key)
                .execute(&mut *self.conn().await?)
                .await?;
            Ok(())
        })
    }

    fn new_client_secret<'a>(
        &'a self,
        id: &'a AgentId,
        secret_hash: &'a [u8; 32],
        mac: &'a [u8; 32],
        now: Millis,
        previous_until: Millis,
    ) -> StoreFuture<'a, ()> {
        // A rotation running at the same time as this one added its secret after this one
        // expired what it saw: the index of one current secret refuses this one's, which then
        // runs again and expires that one too.
        Box::pin(async move {
            let mut tries = 0;
            loop {
                tries += 1;
                let attempt = async {
                    let mut tx = self.begin().await?;
                    sqlx::query("DELETE FROM client_secrets WHERE agent_id = $1 AND expires_at IS NOT NULL")
                        .bind(id.as_str())
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "UPDATE client_secrets SET expires_at = $2 WHERE agent_id = $1 AND expires_at IS NULL",
                    )
                    .bind(id.as_str())
                    .bind(previous_until.0)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query(
                        "INSERT INTO client_secrets (agent_id, secret_hash, created_at, expires_at, mac) \
                         VALUES ($1, $2, $3, NULL, $4)",
                    )
                    .bind(id.as_str())
                    .bind(&secret_hash[..])
                    .bind(now.0)
                    .bind(&mac[..])
                    .execute(&mut *tx)
                    .await?;
                    crate::sql::commit(tx).await
                };
                match attempt.await {
                    // Each conflict is another rotation that committed: this one makes progress.
                    Err(StoreError::Conflict(_)) if tries < 32 => continue,
                    done => return done,
                }
            }
        })
    }

    fn client_secret_holds<'a>(
        &'a self,
        id: &'a AgentId,
        secret_hash: &'a [u8; 32],
        now: Millis,
    ) -> StoreFuture<'a, Option<(Millis, Vec<u8>)>> {
        Box::pin(async move {
            let found: Option<(i64, Vec<u8>)> = sqlx::query_as(
                "SELECT created_at, mac FROM client_secrets WHERE agent_id = $1 AND secret_hash = $2 \
                 AND (expires_at IS NULL OR expires_at > $3)",
            )
            .bind(id.as_str())
            .bind(&secret_hash[..])
            .bind(now.0)
            .fetch_optional(&mut *self.conn().await?)
            .await?;
            Ok(found.map(|(at, mac)| (Millis(at), mac)))
        })
    }

    fn forget_assertions(&self, now: Millis) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            sqlx::query("DELETE FROM client_assertions WHERE expires_at < $1")
                .bind(now.0)
                .execute(&mut *self.conn().await?)
                .await?;
            Ok(())
        })
    }

    fn revoke_agent<'a>(
        &'a self,
        id: &'a AgentId,
        at: Millis,
        reason: Option<&'a str>,
    ) -> StoreFuture<'a, Option<(AgentRecord, Option<i64>)>> {
        // As `insert_agent_placed`: run again after a failure before the COMMIT. A revocation
        // whose COMMIT broke runs again too: a second run returns what the first stored, and
        // queues the events only when it is the one that revokes.
        let run = move || {
            self.outage.ride_out(move || async move {
                let mut tx = self.begin().await?;
                let revoked = revoke_in(&mut tx, &[id.as_str().to_owned()], at, reason).await?;
                self.outage.commit(tx).await?;
                Ok(revoked.into_iter().next())
            })
        };
        Box::pin(async move {
            match run().await {
                Err(StoreError::OutcomeUnknown(_)) => run().await,
                other => other,
            }
        })
    }

    fn revocations_after(&self, after: i64) -> StoreFuture<'_, RevokedSince> {
        Box::pin(async move {
            // One statement, so the epoch and the list come from the same snapshot; the
            // epoch's row is the one without an agent id.
            let rows: Vec<RevocationRow> = sqlx::query_as(
                "SELECT CAST(NULL AS TEXT) AS id, CAST(NULL AS TEXT) AS reason, epoch, \
                 CAST(NULL AS BIGINT) AS revoked_at, CAST(NULL AS TEXT) AS status_list, \
                 CAST(NULL AS BIGINT) AS status_idx FROM revocation_epoch WHERE id = 1 \
                 UNION ALL \
                 SELECT id, revocation_reason, revoked_epoch, revoked_at, status_list, status_idx \
                 FROM agents WHERE revoked_epoch > $1",
            )
            .bind(after)
            .fetch_all(&mut *self.conn().await?)
            .await?;
            let mut out = RevokedSince::default();
            for row in rows {
                match row.id {
                    Some(id) => out.revoked.push(Revocation {
                        agent_id: decode("agent", &id, AgentId::parse)?,
                        reason: row.reason,
                        at: Millis(row.revoked_at.unwrap_or(0)),
                        place: place(row.status_list, row.status_idx)?,
                    }),
                    None => out.epoch = row.epoch,
                }
            }
            Ok(out)
        })
    }
}
