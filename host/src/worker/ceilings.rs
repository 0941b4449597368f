//! A submitter's own timeout ceiling, read again as its job is claimed:
//! a ceiling lowered while the job waited holds its run. Read at most once
//! a second per principal, so a busy pool does not add a read per job.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::JobStore;

/// How long a principal's ceiling read here is used before it is read again.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// The ceilings read so far, by principal.
#[derive(Debug)]
pub(crate) struct SubmitterCeilings {
    store: Arc<dyn JobStore>,
    read: Mutex<HashMap<String, (Instant, Option<Duration>)>>,
}

impl SubmitterCeilings {
    pub(crate) fn new(store: Arc<dyn JobStore>) -> Self {
        SubmitterCeilings { store, read: Mutex::default() }
    }

    /// `name`'s longest timeout now, if it has one (a principal removed, or
    /// a store that cannot answer, leaves the job's own timeout alone).
    pub(crate) async fn max_timeout(&self, name: &str) -> Option<Duration> {
        if let Some((at, max)) = self.read.lock().unwrap_or_else(|e| e.into_inner()).get(name)
            && at.elapsed() < FRESH_FOR
        {
            return *max;
        }
        let read = self.store.principal_get(name.to_owned()).await;
        let max = read.ok().flatten().and_then(|p| p.ceilings.max_timeout_ms).map(Duration::from_millis);
        self.read.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), (Instant::now(), max));
        max
    }
}
