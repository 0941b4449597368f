//! Prometheus metrics for one process: what its pool did, and the store's
//! queue depth read at scrape time.
//!
//! Counters and histograms are updated where things happen (claim, finish,
//! renewal); gauges that describe the present (queue depth, free slots)
//! are refreshed by [`crate::runtime::Runtime::metrics_text`] just before
//! encoding.
//!
//! They come in two parts: the API's (queue depth, waits, the event loop,
//! event clients, pool restarts) and the pool's (everything about running
//! jobs). A process that runs both exports both; `leash serve` with its
//! pool in a child process exports its own API part and the part its
//! child reports.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::job::{Counts, ErrorKind, JobStatus};

/// Most plugins one process labels metrics with; jobs of any plugin seen
/// after them share the label [`OTHER_PLUGINS`], so a registry that keeps
/// growing cannot grow the scrape without bound.
pub const MAX_PLUGIN_LABELS: usize = 64;

/// The `plugin` label of jobs past [`MAX_PLUGIN_LABELS`].
pub const OTHER_PLUGINS: &str = "(other)";

/// Labels of a finished job.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Terminal status.
    pub status: String,
    /// Error kind, empty for success.
    pub error_kind: String,
    /// The job's plugin (see [`Metrics::plugin_label`]); empty for jobs a
    /// sweep quarantined, whose plugin it does not read.
    pub plugin: String,
}

/// Label of a per-plugin histogram.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    /// The job's plugin (see [`Metrics::plugin_label`]).
    pub plugin: String,
}

/// Labels of an ended attempt.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// The job's plugin (see [`Metrics::plugin_label`]).
    pub plugin: String,
    /// How the attempt ended: [`AttemptEnd::as_str`].
    pub outcome: &'static str,
}

/// How an attempt a pool ran ended, as `leash_attempts_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The job finished with this status.
    Finished(JobStatus),
    /// Failed retryably and queued again after its backoff.
    Retried,
    /// Given back (shutdown, a host fault) to run again.
    Released,
    /// The lease was lost: the attempt's result was dropped.
    LeaseLost,
}

impl AttemptEnd {
    /// The `outcome` label: a finished job's status, or `retried`,
    /// `released`, `lease_lost` (the words of `GET /v1/jobs/{id}/attempts`).
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptEnd::Finished(status) => status.as_str(),
            AttemptEnd::Retried => "retried",
            AttemptEnd::Released => "released",
            AttemptEnd::LeaseLost => "lease_lost",
        }
    }
}

/// Label of an outbound HTTP request count: `sent` or `denied`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// `sent` or `denied`.
    pub result: &'static str,
}

/// Label of a schedule firing's count: `submitted`, `skipped` or `lost`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FiringLabels {
    /// `submitted` (jobs went in), `skipped` (taken, nothing submitted) or
    /// `lost` (another scheduler took it first).
    pub outcome: &'static str,
}

/// Label of an outbound request its rate limits delayed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PaceLabels {
    /// `waited` (sent at its slot) or `too_late` (its slot was past the
    /// job's deadline: the attempt ended `rate_limited`).
    pub outcome: &'static str,
}

/// Label of a queue-depth gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// Job status.
    pub state: String,
}

/// Every metric a process exports.
#[derive(Debug)]
pub struct Metrics {
    api: Registry,
    pool: Registry,
    /// Jobs this process finished, by status and error kind.
    pub jobs_finished: Family<OutcomeLabels, Counter>,
    /// Jobs in the store, by state (refreshed at scrape).
    pub queue_depth: Family<StateLabels, Gauge>,
    /// How long the longest-waiting claimable job has waited (refreshed at
    /// scrape).
    pub oldest_queued_seconds: Gauge<f64, AtomicU64>,
    /// Attempts this process ran, by plugin and how they ended.
    pub attempts: Family<AttemptLabels, Counter>,
    /// Wall time of one attempt, from its claim to its recorded end.
    pub job_duration_seconds: Family<PluginLabels, Histogram>,
    /// Time from when a job could run (`run_after`) to its claim.
    pub queue_wait_seconds: Family<PluginLabels, Histogram>,
    /// The plugin labels given out so far.
    plugin_labels: Mutex<HashSet<String>>,
    /// Jobs running in this process.
    pub running: Gauge,
    /// Job slots in this process.
    pub pool_size: Gauge,
    /// Free job slots in this process.
    pub free_slots: Gauge,
    /// Time of one claim-loop round trip to the store (a job claimed with
    /// the finish of the slot's previous one is timed in `complete_seconds`).
    pub claim_seconds: Histogram,
    /// Time to record one job's outcome in the store.
    pub complete_seconds: Histogram,
    /// Lease renewals that held.
    pub lease_renewals: Counter,
    /// Leases this process lost (its result dropped).
    pub leases_lost: Counter,
    /// Failed attempts queued again for a retry.
    pub retries: Counter,
    /// Waiters that gave up before their job ended (the job goes on).
    pub waits_abandoned: Counter,
    /// Fuel used by finished jobs.
    pub fuel_used: Counter,
    /// Guests' outbound HTTP requests, sent and denied.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Outbound requests their rate limits delayed, by outcome.
    pub http_rate_waits: Family<PaceLabels, Counter>,
    /// Schedule firings this process's scheduler met, by outcome.
    pub schedule_firings: Family<FiringLabels, Counter>,
    /// How late a 100 ms timer fires on the async runtime.
    pub event_loop_lag_seconds: Gauge<f64, AtomicU64>,
    /// Event stream clients connected to this process.
    pub event_clients: Gauge,
    /// Times a supervised pool process died and was started again.
    pub pool_restarts: Counter,
}

/// Buckets for guests' run times and waits behind a backlog: 1 ms to
/// about 70 min, each bound four times the last.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 12))
}

/// The OpenMetrics text of `registry` without its closing `# EOF`.
fn encode_part(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    match text.strip_suffix("# EOF\n") {
        Some(body) => body.to_owned(),
        None => text,
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, registered under `leash_`.
    pub fn new() -> Self {
        let mut api = Registry::with_prefix("leash");
        let mut registry = Registry::with_prefix("leash");
        let jobs_finished = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "jobs_finished",
            "Jobs this process finished, by status and error kind",
            jobs_finished.clone(),
        );
        let queue_depth = Family::<StateLabels, Gauge>::default();
        api.register("queue_depth", "Jobs in the store by state", queue_depth.clone());
        let oldest_queued_seconds = Gauge::<f64, AtomicU64>::default();
        api.register(
            "oldest_queued_seconds",
            "How long the longest-waiting queued job has been claimable (0 when none is)",
            oldest_queued_seconds.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "attempts",
            "Attempts this process ran, by plugin and how they ended (a finished job's status, retried, released, lease_lost)",
            attempts.clone(),
        );
        let durations = || Family::<PluginLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> _);
        let job_duration_seconds: Family<PluginLabels, Histogram> = durations();
        registry.register(
            "job_duration_seconds",
            "Wall time of one attempt, from its claim to its recorded end, by plugin",
            job_duration_seconds.clone(),
        );
        let queue_wait_seconds: Family<PluginLabels, Histogram> = durations();
        registry.register(
            "queue_wait_seconds",
            "Time from when a job could run (its run_after: submit, approval or retry backoff) to its claim, by plugin",
            queue_wait_seconds.clone(),
        );
        let running = Gauge::default();
        registry.register("running_jobs", "Jobs running in this process", running.clone());
        let pool_size = Gauge::default();
        registry.register("pool_slots", "Job slots in this process", pool_size.clone());
        let free_slots = Gauge::default();
        registry.register("pool_free_slots", "Free job slots in this process", free_slots.clone());
        let latency = || Histogram::new(exponential_buckets(0.000_05, 2.0, 18));
        let claim_seconds = latency();
        registry.register(
            "claim_seconds",
            "Time of one claim-loop round trip to the store (claims made with a finish are in complete_seconds)",
            claim_seconds.clone(),
        );
        let complete_seconds = latency();
        registry.register("complete_seconds", "Time to record a job's outcome", complete_seconds.clone());
        let lease_renewals = Counter::default();
        registry.register("lease_renewals", "Lease renewals that held", lease_renewals.clone());
        let leases_lost = Counter::default();
        registry.register("leases_lost", "Leases this process lost", leases_lost.clone());
        let waits_abandoned = Counter::default();
        api.register(
            "waits_abandoned",
            "Waiters that gave up before their job ended: a sync HTTP client that disconnected, a wait that timed out (the job goes on)",
            waits_abandoned.clone(),
        );
        let retries = Counter::default();
        registry.register("job_retries", "Failed attempts this process queued again for a retry", retries.clone());
        let fuel_used = Counter::default();
        registry.register("fuel_used", "Fuel used by jobs this process finished", fuel_used.clone());
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "Guests' outbound HTTP requests in this process: sent, or denied by the job's grant",
            http_requests.clone(),
        );
        let http_rate_waits = Family::<PaceLabels, Counter>::default();
        registry.register(
            "http_rate_waits",
            "Guests' outbound requests a rate limit gave a later slot: waited for it, or too_late (past the job's deadline)",
            http_rate_waits.clone(),
        );
        let schedule_firings = Family::<FiringLabels, Counter>::default();
        registry.register(
            "schedule_firings",
            "Schedule firings this process's scheduler took (submitted, skipped) or found taken by another (lost)",
            schedule_firings.clone(),
        );
        let event_loop_lag_seconds = Gauge::<f64, AtomicU64>::default();
        api.register(
            "event_loop_lag_seconds",
            "How late a 100 ms timer last fired on the async runtime",
            event_loop_lag_seconds.clone(),
        );
        let event_clients = Gauge::default();
        api.register("event_clients", "Event stream clients connected to this process", event_clients.clone());
        let pool_restarts = Counter::default();
        api.register(
            "pool_restarts",
            "Times leash serve's pool process died and was started again",
            pool_restarts.clone(),
        );
        Metrics {
            api,
            pool: registry,
            pool_restarts,
            event_clients,
            jobs_finished,
            queue_depth,
            oldest_queued_seconds,
            attempts,
            job_duration_seconds,
            queue_wait_seconds,
            plugin_labels: Mutex::new(HashSet::new()),
            running,
            pool_size,
            free_slots,
            claim_seconds,
            complete_seconds,
            lease_renewals,
            leases_lost,
            retries,
            waits_abandoned,
            fuel_used,
            http_requests,
            http_rate_waits,
            schedule_firings,
            event_loop_lag_seconds,
        }
    }

    /// Count one schedule firing's outcome.
    pub fn firing(&self, outcome: &'static str) {
        self.schedule_firings.get_or_create(&FiringLabels { outcome }).inc();
    }

    /// Count an outbound request its rate limits delayed.
    pub fn rate_wait(&self, outcome: &'static str) {
        self.http_rate_waits.get_or_create(&PaceLabels { outcome }).inc();
    }

    /// Count a run's outbound HTTP requests.
    pub fn http(&self, sent: u64, denied: u64) {
        for (result, n) in [("sent", sent), ("denied", denied)] {
            if n > 0 {
                self.http_requests.get_or_create(&HttpLabels { result }).inc_by(n);
            }
        }
    }

    /// The `plugin` label of a job whose plugin is `name`: the name
    /// itself for the first [`MAX_PLUGIN_LABELS`] names this process
    /// sees, [`OTHER_PLUGINS`] after them.
    pub fn plugin_label(&self, name: &str) -> String {
        let mut seen = self.plugin_labels.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(name) {
            return name.to_owned();
        }
        if seen.len() < MAX_PLUGIN_LABELS {
            seen.insert(name.to_owned());
            return name.to_owned();
        }
        OTHER_PLUGINS.to_owned()
    }

    /// Count an attempt's end and time it.
    pub fn attempt_ended(&self, plugin: &str, end: AttemptEnd, took: Duration) {
        let plugin = plugin.to_owned();
        self.attempts.get_or_create(&AttemptLabels { plugin: plugin.clone(), outcome: end.as_str() }).inc();
        self.job_duration_seconds.get_or_create(&PluginLabels { plugin }).observe(took.as_secs_f64());
    }

    /// Time a claimed job's wait in the queue.
    pub fn queue_waited(&self, plugin: &str, waited: Duration) {
        self.queue_wait_seconds
            .get_or_create(&PluginLabels { plugin: plugin.to_owned() })
            .observe(waited.as_secs_f64());
    }

    /// Count a finished job.
    pub fn job_finished(&self, plugin: &str, status: JobStatus, error_kind: Option<ErrorKind>, fuel: u64) {
        let labels = OutcomeLabels {
            status: status.as_str().to_owned(),
            error_kind: error_kind.map(|k| k.as_str().to_owned()).unwrap_or_default(),
            plugin: plugin.to_owned(),
        };
        self.jobs_finished.get_or_create(&labels).inc();
        self.fuel_used.inc_by(fuel);
    }

    /// Count jobs quarantined (`host_crash`) by a reclaim here: they end
    /// as `failed` with that kind without a pool finishing them.
    pub fn jobs_quarantined(&self, n: u64) {
        if n > 0 {
            let labels = OutcomeLabels {
                status: "failed".to_owned(),
                error_kind: ErrorKind::HostCrash.as_str().to_owned(),
                plugin: String::new(),
            };
            self.jobs_finished.get_or_create(&labels).inc_by(n);
        }
    }

    /// Set the oldest-queued gauge: `waited` is how long the job waiting
    /// longest has been claimable, `None` when no job is.
    pub fn set_oldest_queued(&self, waited: Option<Duration>) {
        self.oldest_queued_seconds.set(waited.unwrap_or_default().as_secs_f64());
    }

    /// Set the queue-depth gauges from a snapshot.
    pub fn set_counts(&self, counts: &Counts) {
        for state in JobStatus::ALL {
            let n = counts.of(state);
            self.queue_depth.get_or_create(&StateLabels { state: state.as_str().to_owned() }).set(n as i64);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.encode_with_pool(&self.encode_pool())
    }

    /// The exposition of this process's API metrics and `pool`, a pool's
    /// part as [`Metrics::encode_pool`] wrote it (in this process or in
    /// the pool's).
    pub fn encode_with_pool(&self, pool: &str) -> String {
        format!("{}{pool}# EOF\n", encode_part(&self.api))
    }

    /// The pool's part, without the closing `# EOF`.
    pub fn encode_pool(&self) -> String {
        encode_part(&self.pool)
    }

    /// Measure event-loop lag forever: sleep 100 ms, record the overshoot.
    pub async fn watch_event_loop(self: std::sync::Arc<Self>) {
        const PERIOD: Duration = Duration::from_millis(100);
        loop {
            let asked = tokio::time::Instant::now();
            tokio::time::sleep(PERIOD).await;
            let late = asked.elapsed().saturating_sub(PERIOD);
            self.event_loop_lag_seconds.set(late.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_labels_stop_growing_at_the_bound() {
        let metrics = Metrics::new();
        for i in 0..MAX_PLUGIN_LABELS {
            assert_eq!(metrics.plugin_label(&format!("p{i}")), format!("p{i}"));
        }
        assert_eq!(metrics.plugin_label("one-too-many"), OTHER_PLUGINS);
        assert_eq!(metrics.plugin_label("p0"), "p0", "a name seen before keeps its label");
    }
}
