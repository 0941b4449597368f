//! What each job's store holds, and the host side of the `host` interface.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::leash::plugin::{host, types};
use super::limiter::JobLimiter;
use super::stop::StopHandle;

/// Longest log message kept, in bytes; longer ones are cut.
pub const MAX_LOG_MESSAGE_BYTES: usize = 4096;

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
    /// Key/value fields, as the guest gave them.
    pub fields: Vec<(String, String)>,
    /// Milliseconds since the job started running.
    pub elapsed_ms: u64,
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

    /// Keep `record` if it fits under both caps; returns it if kept.
    pub(crate) fn push(&mut self, record: LogRecord) -> Option<&LogRecord> {
        let size = record.message.len() + record.fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if self.records.len() >= self.max_records || self.bytes + size > self.max_bytes {
            self.dropped += 1;
            return None;
        }
        self.bytes += size;
        self.records.push(record);
        self.records.last()
    }
}

fn truncate_at_char_boundary(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// The data of one job's store.
pub(crate) struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: JobLimiter,
    pub(crate) logs: LogBook,
    pub(crate) last_progress: Option<Progress>,
    pub(crate) stop: StopHandle,
    pub(crate) observer: Arc<dyn RunObserver>,
    pub(crate) started: Instant,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl types::Host for HostState {}

impl host::Host for HostState {
    async fn log(&mut self, level: host::Level, message: String, fields: Vec<(String, String)>) {
        let level = match level {
            host::Level::Trace => LogLevel::Trace,
            host::Level::Debug => LogLevel::Debug,
            host::Level::Info => LogLevel::Info,
            host::Level::Warn => LogLevel::Warn,
            host::Level::Error => LogLevel::Error,
        };
        let record = LogRecord {
            level,
            message: truncate_at_char_boundary(message, MAX_LOG_MESSAGE_BYTES),
            fields,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
        };
        if let Some(kept) = self.logs.push(record) {
            self.observer.on_log(kept);
        }
    }

    async fn progress(&mut self, done: u64, total: u64, note: String) -> bool {
        let progress = Progress { done, total, note: truncate_at_char_boundary(note, MAX_LOG_MESSAGE_BYTES) };
        self.observer.on_progress(&progress);
        self.last_progress = Some(progress);
        self.stop.is_requested()
    }

    async fn cancelled(&mut self) -> bool {
        self.stop.is_requested()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(message: &str) -> LogRecord {
        LogRecord { level: LogLevel::Info, message: message.to_owned(), fields: Vec::new(), elapsed_ms: 0 }
    }

    #[test]
    fn log_book_counts_what_it_drops_past_either_cap() {
        let mut book = LogBook::new(2, 1000);
        assert!(book.push(record("a")).is_some());
        assert!(book.push(record("b")).is_some());
        assert!(book.push(record("c")).is_none());
        assert_eq!((book.records.len(), book.dropped), (2, 1));

        let mut book = LogBook::new(100, 5);
        assert!(book.push(record("abc")).is_some());
        assert!(book.push(record("abc")).is_none());
        assert_eq!(book.dropped, 1);
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let s = truncate_at_char_boundary("é".repeat(10), 5);
        assert_eq!(s, "éé");
    }
}
