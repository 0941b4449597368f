//! A job's journal: the log records and progress reports its guest (and
//! the host on its behalf) writes, cut to their caps, cleaned of the job's
//! secrets and shown to the run's observer as they are kept.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::redact::Redactor;
use crate::job::millis;

/// Longest log message or progress note kept, in bytes; longer ones are cut.
pub const MAX_LOG_MESSAGE_BYTES: usize = 4096;
/// Most fields kept per log record; the rest are counted in a last field.
pub const MAX_LOG_FIELDS: usize = 32;
/// Longest log field key kept, in bytes.
pub const MAX_LOG_KEY_BYTES: usize = 128;
/// Longest log field value kept, in bytes.
pub const MAX_LOG_VALUE_BYTES: usize = 1024;
/// The key of the field that counts fields dropped past [`MAX_LOG_FIELDS`].
pub const FIELDS_DROPPED_KEY: &str = "leash.fields_dropped";

/// Severity of a guest's log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Fine-grained detail.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected but handled.
    Warn,
    /// A failure.
    Error,
}

impl LogLevel {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// One structured log line from a guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Severity.
    pub level: LogLevel,
    /// The message, cut to [`MAX_LOG_MESSAGE_BYTES`].
    pub message: String,
    /// Key/value fields: the first [`MAX_LOG_FIELDS`], keys and values cut
    /// to [`MAX_LOG_KEY_BYTES`] and [`MAX_LOG_VALUE_BYTES`]; a record that
    /// had more ends with a [`FIELDS_DROPPED_KEY`] field counting them.
    pub fields: Vec<(String, String)>,
    /// Since the job started running (whole milliseconds).
    #[serde(rename = "elapsed_ms", with = "crate::job::millis")]
    pub elapsed: Duration,
}

/// A guest's latest progress report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Units done.
    pub done: u64,
    /// Units in all (0 when unknown).
    pub total: u64,
    /// A short note from the guest.
    pub note: String,
}

/// Watches a running job. Called on the job's task: keep it quick.
pub trait RunObserver: Send + Sync {
    /// A log record the host kept (records past either cap are not seen).
    fn on_log(&self, _record: &LogRecord) {}
    /// A progress heartbeat.
    fn on_progress(&self, _progress: &Progress) {}
}

/// An observer that ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl RunObserver for NoObserver {}

/// Bounded log storage for one job.
#[derive(Debug)]
pub(crate) struct LogBook {
    pub(crate) records: Vec<LogRecord>,
    pub(crate) dropped: u64,
    bytes: usize,
    max_records: usize,
    max_bytes: usize,
}

impl LogBook {
    pub(crate) fn new(max_records: usize, max_bytes: usize) -> Self {
        LogBook { records: Vec::new(), dropped: 0, bytes: 0, max_records, max_bytes }
    }

    /// Keep `record` if it fits under both caps; returns it if kept. The
    /// byte cap is charged what the record costs the host, not just its
    /// text: an empty field still costs its two strings.
    pub(crate) fn push(&mut self, record: LogRecord) -> Option<&LogRecord> {
        let size = host_cost(&record);
        if self.records.len() >= self.max_records || self.bytes + size > self.max_bytes {
            self.dropped += 1;
            return None;
        }
        self.bytes += size;
        self.records.push(record);
        self.records.last()
    }
}

/// The bytes a kept record occupies in the host: its struct, its text and
/// one pair of strings per field, by what is allocated, not what is used.
pub(crate) fn host_cost(record: &LogRecord) -> usize {
    std::mem::size_of::<LogRecord>()
        + record.message.capacity()
        + record.fields.capacity() * std::mem::size_of::<(String, String)>()
        + record.fields.iter().map(|(k, v)| k.capacity() + v.capacity()).sum::<usize>()
}

/// The fields a record keeps: the first [`MAX_LOG_FIELDS`] - 1 cut to
/// their caps, then either the last one or a count of those dropped. A new
/// vector, so the kept record does not hold on to the allocation wasmtime
/// made for every field the guest sent.
fn bounded_fields(fields: Vec<(String, String)>) -> Vec<(String, String)> {
    let cut = |(k, v): (String, String)| (cut_text(k, MAX_LOG_KEY_BYTES), cut_text(v, MAX_LOG_VALUE_BYTES));
    let total = fields.len();
    let keep = if total <= MAX_LOG_FIELDS { total } else { MAX_LOG_FIELDS - 1 };
    let mut kept = Vec::with_capacity(keep + usize::from(keep < total));
    kept.extend(fields.into_iter().take(keep).map(cut));
    if keep < total {
        kept.push((FIELDS_DROPPED_KEY.to_owned(), (total - keep).to_string()));
    }
    kept
}

/// `s` cut to at most `max` bytes on a character boundary, marked with
/// `…` when anything was cut (the mark counts against `max`), and holding
/// no more memory than it needs.
pub(crate) fn cut_text(mut s: String, max: usize) -> String {
    const MARK: &str = "…";
    if s.len() > max {
        let mut cut = max.saturating_sub(MARK.len());
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str(MARK);
        s.shrink_to_fit();
    }
    s
}

/// A job's log: kept records under the caps, shown to the observer as
/// they are kept. Shared with the host's HTTP tasks, which log refusals
/// they find after the guest's call has returned.
/// Secret values the job was granted are replaced by their `{secret:NAME}`
/// reference before a record is kept.
#[derive(Clone)]
pub(crate) struct Journal {
    book: Arc<Mutex<LogBook>>,
    observer: Arc<dyn RunObserver>,
    started: Instant,
    redactor: Arc<Redactor>,
}

impl Journal {
    pub(crate) fn new(
        book: LogBook,
        observer: Arc<dyn RunObserver>,
        started: Instant,
        redactor: Arc<Redactor>,
    ) -> Self {
        Journal { book: Arc::new(Mutex::new(book)), observer, started, redactor }
    }

    /// Replace the job's secret values in `text` by their references.
    pub(crate) fn clean(&self, text: &mut String) {
        self.redactor.clean(text);
    }

    /// A progress report, cleaned and cut like a log message, shown to the
    /// observer.
    pub(crate) fn progress(&self, done: u64, total: u64, mut note: String) -> Progress {
        self.clean(&mut note);
        let progress = Progress { done, total, note: cut_text(note, MAX_LOG_MESSAGE_BYTES) };
        self.observer.on_progress(&progress);
        progress
    }

    /// Keep a record (cut to the caps) if it fits.
    pub(crate) fn record(&self, level: LogLevel, mut message: String, mut fields: Vec<(String, String)>) {
        if !self.redactor.is_empty() {
            self.clean(&mut message);
            for (key, value) in &mut fields {
                self.clean(key);
                self.clean(value);
            }
        }
        let record = LogRecord {
            level,
            message: cut_text(message, MAX_LOG_MESSAGE_BYTES),
            fields: bounded_fields(fields),
            elapsed: Duration::from_millis(millis::of(self.started.elapsed())),
        };
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = book.push(record) {
            self.observer.on_log(kept);
        }
    }

    /// The kept records and the count dropped, leaving the journal empty.
    pub(crate) fn take(&self) -> (Vec<LogRecord>, u64) {
        let mut book = self.book.lock().unwrap_or_else(|e| e.into_inner());
        (std::mem::take(&mut book.records), book.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(message: &str) -> LogRecord {
        LogRecord { level: LogLevel::Info, message: message.to_owned(), fields: Vec::new(), elapsed: Duration::ZERO }
    }

    #[test]
    fn log_book_counts_what_it_drops_past_either_cap() {
        let mut book = LogBook::new(2, 1000);
        assert!(book.push(record("a")).is_some());
        assert!(book.push(record("b")).is_some());
        assert!(book.push(record("c")).is_none());
        assert_eq!((book.records.len(), book.dropped), (2, 1));

        let one = host_cost(&record("abc"));
        let mut book = LogBook::new(100, one + 5);
        assert!(book.push(record("abc")).is_some());
        assert!(book.push(record("abc")).is_none());
        assert_eq!(book.dropped, 1);
    }

    #[test]
    fn empty_fields_are_charged_their_host_cost() {
        let mut empty = record("");
        empty.fields = vec![(String::new(), String::new()); 10];
        assert!(host_cost(&empty) >= 10 * std::mem::size_of::<(String, String)>());
        let mut book = LogBook::new(usize::MAX, 64 << 10);
        let mut kept = 0;
        while book.push(empty.clone()).is_some() {
            kept += 1;
        }
        assert!(kept * host_cost(&empty) <= 64 << 10, "the byte cap bounds empty records too");
    }

    #[test]
    fn fields_past_the_cap_are_counted_in_a_last_field() {
        let fields = vec![(String::new(), String::new()); 100_000];
        let kept = bounded_fields(fields);
        assert_eq!(kept.len(), MAX_LOG_FIELDS);
        assert_eq!(kept.last().unwrap(), &(FIELDS_DROPPED_KEY.to_owned(), (100_000 - MAX_LOG_FIELDS + 1).to_string()));
        assert!(kept.capacity() <= MAX_LOG_FIELDS, "the guest's allocation is not kept");
        let long = bounded_fields(vec![("k".repeat(1000), "v".repeat(100_000))]);
        assert_eq!((long[0].0.len(), long[0].1.len()), (MAX_LOG_KEY_BYTES, MAX_LOG_VALUE_BYTES));
        assert!(long[0].1.capacity() <= MAX_LOG_VALUE_BYTES, "a cut value gives its memory back");
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_and_marked() {
        let s = cut_text("é".repeat(10), 8);
        assert_eq!(s, "éé…");
        assert!(s.len() <= 8);
        assert_eq!(cut_text("short".into(), 8), "short");
    }
}
