//! Helpers the benchmarks share (each bench includes this with `#[path]`).

#![allow(dead_code)]

use std::time::Duration;

use leash::sandbox::{Allocator, SandboxConfig};

/// The `p` quantile of sorted samples (nearest rank).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The median of `samples` (the upper one of an even count).
pub fn median<T: PartialOrd>(mut samples: Vec<T>) -> T {
    samples.sort_by(|a, b| a.partial_cmp(b).expect("samples are comparable"));
    samples.swap_remove(samples.len() / 2)
}

/// Milliseconds, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Microseconds, for printing.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A pooling sandbox with `slots` instances and the benchmarks' shared
/// compiled-component cache.
pub fn sandbox_config(slots: usize) -> SandboxConfig {
    let cache_dir = Some(std::env::temp_dir().join("leash-bench-cache"));
    SandboxConfig { allocator: Allocator::Pooling { slots: slots as u32 }, cache_dir, ..SandboxConfig::default() }
}

/// A store-level job of `plugin` (an `echo` in the durable bench): one
/// attempt, a day's queue TTL, priority 0; for filling the store directly.
pub fn raw_job(plugin: leash::job::Digest) -> leash::job::NewJob {
    leash::job::NewJob {
        plugin,
        plugin_name: None,
        target: leash::job::Target::Execute,
        input: b"x".to_vec(),
        limits: leash::job::JobLimits {
            timeout: Duration::from_secs(60),
            fuel: None,
            memory_bytes: 64 << 20,
            output_bytes: 1 << 20,
        },
        grants: Default::default(),
        max_attempts: 1,
        free_rerun_limit: 0,
        concurrency_key: None,
        plan_id: None,
        queue_ttl: Duration::from_secs(86_400),
        idempotency: None,
        run_at: None,
        deadline: None,
        backoff: leash::job::Backoff::default(),
        approval: None,
        approval_ttl: leash::job::DEFAULT_APPROVAL_TTL,
        submitted_by: None,
        priority: 0,
        schedule_id: None,
        tags: Vec::new(),
        metadata: Default::default(),
        rate_limit: None,
        rate_key: String::new(),
    }
}

/// The finish of a claimed job as succeeded with a one-byte output, at
/// `now`: what the store-only drains record for each job.
pub fn succeeded(lease: leash::store::Lease, now: leash::clock::Timestamp) -> leash::store::JobFinishParams {
    leash::store::JobFinishParams {
        id: lease.job.id,
        token: lease.token,
        finish: leash::store::Finish::Succeeded { output: b"x".to_vec() },
        fuel_used: 1,
        peak_memory_bytes: 1,
        progress: None,
        logs: None,
        proposals: Vec::new(),
        now,
    }
}
