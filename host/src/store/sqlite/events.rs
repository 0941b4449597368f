//! The SQLite store's [`Events`]: reading the change feed.

use super::SqliteStore;
use super::rows::{db_err, read_events};
use crate::job::EventId;
use crate::store::{EventPage, Events, EventsAfterParams, StoreError};

#[async_trait::async_trait]
impl Events for SqliteStore {
    async fn events_after(&self, params: EventsAfterParams) -> Result<EventPage, StoreError> {
        self.read(move |conn| read_events(conn, params.after, params.limit)).await
    }

    async fn events_head(&self) -> Result<Option<EventId>, StoreError> {
        self.read(|conn| {
            let seq: Option<i64> =
                conn.query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0)).map_err(db_err("reading events"))?;
            Ok(seq.map(|seq| EventId { txn: 0, seq: seq as u64 }))
        })
        .await
    }
}
