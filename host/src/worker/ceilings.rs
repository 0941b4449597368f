//! Submitters' own ceilings, read at submit and again as their jobs are
//! claimed: a ceiling lowered while a job waited holds its run. Read at
//! most once a second per principal, so a busy server or pool does not add
//! a read per job; the server token's principal has none to read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::access::{BOOTSTRAP, PrincipalCeilings};
use crate::store::{JobStore, StoreError};

/// How long a principal's ceilings read here are used before they are read
/// again.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// The ceilings read so far, by principal.
#[derive(Debug)]
pub(crate) struct SubmitterCeilings {
    store: Arc<dyn JobStore>,
    read: Mutex<HashMap<String, (Instant, PrincipalCeilings)>>,
}

impl SubmitterCeilings {
    pub(crate) fn new(store: Arc<dyn JobStore>) -> Self {
        SubmitterCeilings { store, read: Mutex::default() }
    }

    /// `name`'s ceilings now (none for a principal that is not stored).
    pub(crate) async fn of(&self, name: &str) -> Result<PrincipalCeilings, StoreError> {
        if name == BOOTSTRAP {
            return Ok(PrincipalCeilings::default());
        }
        if let Some((at, ceilings)) = self.read.lock().unwrap_or_else(|e| e.into_inner()).get(name)
            && at.elapsed() < FRESH_FOR
        {
            return Ok(*ceilings);
        }
        let ceilings = self.store.principal_get(name.to_owned()).await?.map(|p| p.ceilings).unwrap_or_default();
        self.read.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned(), (Instant::now(), ceilings));
        Ok(ceilings)
    }

    /// `name`'s longest timeout now, if it has one (a store that cannot
    /// answer leaves the job's own timeout alone).
    pub(crate) async fn max_timeout(&self, name: &str) -> Option<Duration> {
        self.of(name).await.ok()?.max_timeout_ms.map(Duration::from_millis)
    }
}
