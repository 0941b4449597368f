//! The event stream's fan-out in one process: a single reader of the
//! store's change feed, polling while anyone listens (and woken early by
//! PostgreSQL's notifications where the store has them), hands each batch
//! to every subscriber through a bounded broadcast.
//!
//! A subscriber never depends on the broadcast for completeness: the store
//! holds every event, so one that starts behind (a resumed client), falls
//! behind (a slow one whose place in the broadcast was overwritten) or
//! sees a batch that does not follow on from what it has, reads the gap
//! from the store at its own pace and joins the broadcast again. The
//! broadcast's size bounds what the process keeps for all of them; a
//! client that stops reading costs nothing but its socket, which the
//! listener closes after its write timeout.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::broadcast;

use super::RuntimeError;
use crate::job::{Event, EventId};
use crate::store::{EventFilter, EventsAfterParams, JobStore, StoreError};

/// Default time between reads of the change feed while a client listens.
pub const DEFAULT_EVENT_POLL: Duration = Duration::from_millis(250);
/// Default retention of events: how far back a client can resume.
pub const DEFAULT_EVENT_TTL: Duration = Duration::from_secs(3_600);
/// Events per read of the store.
const EVENT_PAGE: u32 = 500;
/// Batches the broadcast keeps for subscribers behind the newest.
const BROADCAST_BATCHES: usize = 64;

/// What the reader found in one poll: the events after `after`.
#[derive(Debug)]
struct Batch {
    after: Option<EventId>,
    events: Vec<Event>,
}

/// One process's reader of the change feed.
#[derive(Debug)]
pub(super) struct EventHub {
    store: Arc<dyn JobStore>,
    batches: broadcast::Sender<Arc<Batch>>,
    /// Where the reader goes on from: `None` while nobody listens (it
    /// stops reading); the first subscriber after that sets it to where it
    /// starts, so the reader never starts past a subscriber's place.
    cursor: std::sync::Mutex<Option<Option<EventId>>>,
    poll: Duration,
    reader: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for EventHub {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            reader.abort();
        }
    }
}

impl EventHub {
    pub(super) fn new(store: Arc<dyn JobStore>, poll: Duration) -> Arc<EventHub> {
        let (batches, _) = broadcast::channel(BROADCAST_BATCHES);
        Arc::new(EventHub { store, batches, cursor: Default::default(), poll, reader: Default::default() })
    }

    /// Subscribe to events after `after` (`None`: from now on) that pass
    /// `filter`. Starts the reader on first use.
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        after: Option<EventId>,
        filter: EventFilter,
    ) -> Result<EventStream, RuntimeError> {
        // Subscribed before the start is read: no batch after it is missed.
        let batches = self.batches.subscribe();
        self.start_reader();
        let cursor = match after {
            Some(id) => Some(id),
            None => self.store.events_head().await?,
        };
        // A reader that was idle starts where this subscriber does. One
        // already reading is behind it or level: the subscriber skips what
        // it has.
        self.cursor.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(cursor);
        Ok(EventStream {
            store: self.store.clone(),
            batches,
            cursor,
            catching_up: true,
            missed: false,
            told_missed: false,
            pending: VecDeque::new(),
            filter,
        })
    }

    fn start_reader(self: &Arc<Self>) {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if reader.is_none() {
            *reader = Some(tokio::spawn(read_loop(Arc::downgrade(self), self.store.enqueued())));
        }
    }
}

/// Read the feed every poll interval while anyone subscribes, and
/// broadcast what is new. Ends when the hub is dropped.
async fn read_loop(hub: Weak<EventHub>, mut wake: Option<tokio::sync::watch::Receiver<u64>>) {
    loop {
        let Some(poll) = hub.upgrade().map(|h| h.poll) else { return };
        match wake.as_mut() {
            Some(wake) => {
                let _ = tokio::time::timeout(poll, wake.changed()).await;
            }
            None => tokio::time::sleep(poll).await,
        }
        let Some(hub) = hub.upgrade() else { return };
        // Checked under the lock a subscriber sets the cursor under, so a
        // new subscriber's start is never reset away.
        let after = {
            let mut cursor = hub.cursor.lock().unwrap_or_else(|e| e.into_inner());
            if hub.batches.receiver_count() == 0 {
                *cursor = None;
            }
            *cursor
        };
        let Some(after) = after else { continue };
        match hub.store.events_after(EventsAfterParams { after, limit: EVENT_PAGE }).await {
            Ok(page) => {
                let Some(last) = page.events.last().map(|e| e.id) else { continue };
                *hub.cursor.lock().unwrap_or_else(|e| e.into_inner()) = Some(Some(last));
                // No subscriber left is not an error: the next poll resets.
                let _ = hub.batches.send(Arc::new(Batch { after, events: page.events }));
            }
            Err(e) => tracing::debug!(error = %e, "reading the event feed failed; trying again"),
        }
    }
}

/// What a subscriber receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    /// The next event that passes the filter.
    Event(Box<Event>),
    /// Events after the subscriber's place were deleted by retention before
    /// it read them: what it shows should be reloaded. The stream goes on
    /// from the oldest event kept.
    Missed,
}

/// One subscriber's place in the feed. See the module docs.
#[derive(Debug)]
pub struct EventStream {
    store: Arc<dyn JobStore>,
    batches: broadcast::Receiver<Arc<Batch>>,
    /// The last event read (passed to the caller or filtered out).
    cursor: Option<EventId>,
    /// Read from the store until it has nothing newer.
    catching_up: bool,
    missed: bool,
    /// The gap at the cursor was reported and nothing read since.
    told_missed: bool,
    pending: VecDeque<Event>,
    filter: EventFilter,
}

impl EventStream {
    /// The next item, waiting for one. Fails only if the store does (the
    /// caller may subscribe again after the last event it received).
    pub async fn next(&mut self) -> Result<StreamItem, RuntimeError> {
        loop {
            if std::mem::take(&mut self.missed) {
                return Ok(StreamItem::Missed);
            }
            if let Some(event) = self.pending.pop_front() {
                return Ok(StreamItem::Event(Box::new(event)));
            }
            if self.catching_up {
                let page = self.store.events_after(EventsAfterParams { after: self.cursor, limit: EVENT_PAGE }).await?;
                // Said once per gap: until the reader is past the deleted
                // events, every read from its place reports the same gap.
                self.missed = page.missed && !self.told_missed;
                self.told_missed = page.missed && page.events.is_empty();
                self.catching_up = page.events.len() as u32 == EVENT_PAGE;
                self.take(page.events);
                continue;
            }
            match self.batches.recv().await {
                // A batch that does not follow on from here: read the gap
                // (and the batch) from the store.
                Ok(batch) if batch.after > self.cursor => self.catching_up = true,
                Ok(batch) => self.take(batch.events.iter().cloned()),
                Err(broadcast::error::RecvError::Lagged(_)) => self.catching_up = true,
                Err(broadcast::error::RecvError::Closed) => return Err(RuntimeError::Store(StoreError::Closed)),
            }
        }
    }

    /// Queue the events after the cursor that pass the filter.
    fn take(&mut self, events: impl IntoIterator<Item = Event>) {
        for event in events {
            if Some(event.id) > self.cursor {
                self.cursor = Some(event.id);
                if self.filter.matches(&event) {
                    self.pending.push_back(event);
                }
            }
        }
    }
}
