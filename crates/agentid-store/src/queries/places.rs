//! The SQL of `crate::places` for one backend: `DB` is its database.

use crate::sql::decode;
use crate::StoreError;
use agentid_core::domain::{takes_new_places, ListId, Millis, StatusPlace, MAX_LIST_SIZE, MIN_LIST_SIZE};

use crate::places::PlaceDraw;

use super::DB;

/// How far ahead of this instance's clock another instance's may be.
const CLOCKS_APART_MS: i64 = 5 * 60 * 1000;

/// Takes a free place, as `PlaceDraw` says, inside the caller's exclusive transaction: the
/// place, and its list's size.
pub(crate) async fn allocate(
    tx: &mut sqlx::Transaction<'_, DB>,
    placing: &PlaceDraw,
    now: Millis,
) -> Result<(StatusPlace, u64), StoreError> {
    // The newest list made by now (give or take the fleet's clocks) that still takes places
    // (`takes_new_places`), of a size the service makes and at most the configured one: a row
    // written into the database dated further ahead, or full, would stay the newest for as
    // long, every registration opening a list beside it; one of another size is none of the
    // service's, and no instance holds it.
    let newest: Option<(String, i64, i64)> = sqlx::query_as(
        "SELECT id, size, allocated FROM status_lists WHERE mode = $1 AND created_at <= $2 \
         AND size >= $4 AND size <= $3 AND allocated >= 0 AND allocated < size / 2 \
         ORDER BY created_at DESC, id DESC LIMIT 1",
    )
    .bind(placing.mode.as_str())
    .bind(now.0.saturating_add(CLOCKS_APART_MS))
    .bind(i64::try_from(placing.size.min(MAX_LIST_SIZE)).unwrap_or(i64::MAX))
    .bind(MIN_LIST_SIZE as i64)
    .fetch_optional(&mut **tx)
    .await?;
    let (list, size) = match newest {
        Some((id, size, allocated)) if size > 0 && takes_new_places(size as u64, allocated.max(0) as u64) => {
            (decode("status list", &id, ListId::parse)?, size as u64)
        }
        _ => {
            let size =
                i64::try_from(placing.size).map_err(|_| StoreError::Corrupt("status list size".into()))?;
            sqlx::query(
                "INSERT INTO status_lists (id, size, allocated, created_at, mode) VALUES ($1, $2, 0, $3, $4)",
            )
            .bind(placing.new_list.as_str())
            .bind(size)
            .bind(now.0)
            .bind(placing.mode.as_str())
            .execute(&mut **tx)
            .await?;
            (placing.new_list.clone(), placing.size)
        }
    };
    for draw in &placing.draws {
        let idx = (draw % size) as i64;
        let (taken,): (bool,) =
            sqlx::query_as("SELECT EXISTS (SELECT 1 FROM agents WHERE status_list = $1 AND status_idx = $2)")
                .bind(list.as_str())
                .bind(idx)
                .fetch_one(&mut **tx)
                .await?;
        if !taken {
            sqlx::query("UPDATE status_lists SET allocated = allocated + 1 WHERE id = $1")
                .bind(list.as_str())
                .execute(&mut **tx)
                .await?;
            return Ok((
                StatusPlace {
                    list,
                    idx: idx as u64,
                },
                size,
            ));
        }
    }
    Err(StoreError::Corrupt("no free place found in a status list".into()))
}
