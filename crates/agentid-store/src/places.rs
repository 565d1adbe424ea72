//! Status places: where a new agent's bit lives in a Token Status List of its mode.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::StoreError;
use agentid_core::domain::{KeyMode, Millis, StatusPlace};

/// How a new agent gets its status place: in the newest list of its mode while it has fewer
/// than `fill` places taken, else in a new list `new_list` of `size` places; at the first of
/// `draws` (modulo the list's size) that is free. Test and live agents never share a list.
#[derive(Debug, Clone)]
pub struct PlaceDraw {
    pub mode: KeyMode,
    pub new_list: String,
    pub size: u64,
    pub fill: u64,
    pub draws: Vec<u64>,
}

/// Takes a free place, as `PlaceDraw` says, inside the caller's exclusive transaction: the
/// place, and its list's size.
pub(crate) async fn allocate<DB: Database>(
    tx: &mut sqlx::Transaction<'_, DB>,
    placing: &PlaceDraw,
    now: Millis,
) -> Result<(StatusPlace, u64), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let newest: Option<(String, i64, i64)> = sqlx::query_as(
        "SELECT id, size, allocated FROM status_lists WHERE mode = $1 \
         ORDER BY created_at DESC, id DESC LIMIT 1",
    )
    .bind(placing.mode.as_str())
    .fetch_optional(&mut **tx)
    .await?;
    let (list, size) = match newest {
        Some((id, size, allocated)) if size > 0 && (allocated as u64) < placing.fill.min(size as u64) => {
            (id, size as u64)
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
