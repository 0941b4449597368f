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
    let limits = leash::job::JobLimits {
        timeout: Duration::from_secs(60),
        fuel: None,
        memory_bytes: 64 << 20,
        output_bytes: 1 << 20,
    };
    leash::job::NewJob::new(plugin, leash::job::Target::Execute, b"x".to_vec(), limits)
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
