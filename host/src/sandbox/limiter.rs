//! Per-job memory and table limits that remember what they refused.
//!
//! A Rust guest whose allocation fails aborts with `unreachable`, which
//! looks like any other trap. The limiter records the refusal so the
//! outcome can say `memory_limit` instead of `trap` — and where the
//! guest's stderr stood at that moment, so a later, unrelated trap (a panic
//! printed after a refusal the guest handled) is not blamed on memory.

use wasmtime::ResourceLimiter;

use super::capture::CapturedOutput;
use super::shape::ComponentLimits;

/// The latest memory growth a limiter refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// Total memory the growth asked for.
    pub(crate) wanted_bytes: usize,
    /// Bytes of stderr the guest had written by then.
    pub(crate) stderr_offset: usize,
}

/// Caps linear memory (summed over the job's memories), table growth, and
/// how many instances, memories and tables the job's store may hold.
#[derive(Debug)]
pub(crate) struct JobLimiter {
    max_memory_bytes: usize,
    max_table_elements: usize,
    max_instances: usize,
    max_memories: usize,
    max_tables: usize,
    current_memory_bytes: usize,
    pub(crate) peak_memory_bytes: usize,
    pub(crate) refused_memory: Option<Refusal>,
    stderr: CapturedOutput,
}

impl JobLimiter {
    pub(crate) fn new(
        max_memory_bytes: usize,
        max_table_elements: usize,
        components: &ComponentLimits,
        stderr: CapturedOutput,
    ) -> Self {
        JobLimiter {
            max_memory_bytes,
            max_table_elements,
            max_instances: components.max_core_instances as usize,
            max_memories: components.max_memories as usize,
            max_tables: components.max_tables as usize,
            current_memory_bytes: 0,
            peak_memory_bytes: 0,
            refused_memory: None,
            stderr,
        }
    }
}

impl ResourceLimiter for JobLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.current_memory_bytes - current.min(self.current_memory_bytes) + desired;
        if total > self.max_memory_bytes {
            self.refused_memory = Some(Refusal { wanted_bytes: total, stderr_offset: self.stderr.kept_len() });
            return Ok(false);
        }
        self.current_memory_bytes = total;
        self.peak_memory_bytes = self.peak_memory_bytes.max(total);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= self.max_table_elements)
    }

    fn instances(&self) -> usize {
        self.max_instances
    }

    fn tables(&self) -> usize {
        self.max_tables
    }

    fn memories(&self) -> usize {
        self.max_memories
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max_memory_bytes: usize) -> (JobLimiter, CapturedOutput) {
        let stderr = CapturedOutput::new(1024, 0);
        (JobLimiter::new(max_memory_bytes, 10, &ComponentLimits::default(), stderr.clone()), stderr)
    }

    #[test]
    fn growth_past_the_limit_is_refused_and_the_latest_remembered() {
        let (mut limiter, stderr) = limiter(100);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(limiter.memory_growing(60, 90, None).unwrap());
        assert!(!limiter.memory_growing(90, 200, None).unwrap());
        stderr.push(b"handled\n");
        assert!(!limiter.memory_growing(90, 120, None).unwrap());
        assert_eq!(limiter.peak_memory_bytes, 90);
        assert_eq!(limiter.refused_memory, Some(Refusal { wanted_bytes: 120, stderr_offset: 8 }));
    }

    #[test]
    fn the_limit_covers_all_memories_together() {
        let (mut limiter, _) = limiter(100);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(!limiter.memory_growing(0, 50, None).unwrap());
        assert!(limiter.memory_growing(0, 40, None).unwrap());
        assert_eq!(limiter.peak_memory_bytes, 100);
    }
}
