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
