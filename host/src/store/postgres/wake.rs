//! Waking every store on the database when jobs become claimable.
//!
//! Each store keeps one connection of its own that `LISTEN`s on
//! `leash_jobs` and sends the store's wake-ups to the others. A write that
//! makes jobs claimable (an insert, a release, a requeue, a resume, an
//! approval) calls [`Wakeups::wake`] once its transaction has committed:
//! that wakes this process's claim loop at once and asks for one `NOTIFY`
//! on that connection, outside the write's transaction. Asks that come
//! while a `NOTIFY` is in flight are coalesced into the next one, which
//! covers every write committed before it was sent.
//!
//! Why not `NOTIFY` inside each write's transaction: the server takes one
//! database-wide lock to queue a notification at commit and holds it
//! through the commit's flush, so every submit that notified committed
//! one at a time behind the others' flushes. The wake-up connection
//! commits without waiting for its flush (`synchronous_commit = off`): a
//! notification lost to a crash costs only a poll interval.
//!
//! A process that dies between a write's commit and its `NOTIFY` leaves
//! the other stores to their poll interval, as does a lost connection;
//! the connection reconnects with backoff, and the first wake-up after it
//! is sent again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_postgres::NoTls;

use super::rows::describe;
use crate::store::leases::ring;

/// What the connection runs once it is up: listen, and commit without
/// waiting for the flush.
const SET_UP: &str = "LISTEN leash_jobs; SET synchronous_commit = off";

/// One wake-up for every other listening store.
const WAKE_OTHERS: &str = "NOTIFY leash_jobs";

/// The handle writes call after they commit.
#[derive(Debug, Clone)]
pub(super) struct Wakeups {
    /// Rung for every wake-up, this process's own or another's.
    local: watch::Sender<u64>,
    /// Holds one permit while a `NOTIFY` is owed.
    owed: Arc<Notify>,
}

impl Wakeups {
    pub(super) fn new(local: watch::Sender<u64>) -> Self {
        Wakeups { local, owed: Arc::new(Notify::new()) }
    }

    /// Jobs became claimable in a transaction that has committed: wake
    /// this process's claim loop now and the other stores' soon.
    pub(super) fn wake(&self) {
        ring(&self.local);
        self.owed.notify_one();
    }

    /// Keep the connection up, ringing `local` for every other store's
    /// wake-up (and for every reconnect, which may have missed some), and
    /// sending the owed ones. Runs until aborted.
    pub(super) async fn run(self, config: tokio_postgres::Config, shown: String) {
        let mut pause = Duration::from_millis(100);
        loop {
            match config.connect(NoTls).await {
                Ok((client, mut connection)) => {
                    let (heard, mut hear) = tokio::sync::mpsc::unbounded_channel();
                    let driver = tokio::spawn(async move {
                        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            match message {
                                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                    if heard.send(n.process_id()).is_err() {
                                        return;
                                    }
                                }
                                Ok(_) => {}
                                Err(_) => return,
                            }
                        }
                    });
                    if let Ok(own) = set_up(&client).await {
                        pause = Duration::from_millis(100);
                        ring(&self.local);
                        let hearing = async {
                            while let Some(from) = hear.recv().await {
                                if from != own {
                                    ring(&self.local);
                                }
                            }
                        };
                        let sending = async {
                            loop {
                                self.owed.notified().await;
                                if client.batch_execute(WAKE_OTHERS).await.is_err() {
                                    // Owed still: sent on the next connection.
                                    self.owed.notify_one();
                                    return;
                                }
                            }
                        };
                        tokio::select! {
                            () = hearing => {}
                            () = sending => {}
                        }
                        tracing::warn!(database = %shown, "the wake-up connection was lost; reconnecting");
                    }
                    driver.abort();
                }
                Err(e) => {
                    tracing::debug!(database = %shown, error = %describe(&e), "the wake-up connection could not connect")
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

/// Listen and set the connection up; its backend's process id (its own
/// notifications come back to it and are not news).
async fn set_up(client: &tokio_postgres::Client) -> Result<i32, tokio_postgres::Error> {
    let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
    client.batch_execute(SET_UP).await?;
    Ok(row.get(0))
}
