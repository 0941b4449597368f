//! Per-job memory and table limits that remember what they refused.
//!
//! A Rust guest whose allocation fails aborts with `unreachable`, which
//! looks like any other trap. The limiter records the refusal so the
//! outcome can say `memory_limit` instead of `trap`.

use wasmtime::ResourceLimiter;

/// Caps linear memory (summed over the job's memories) and table growth.
#[derive(Debug)]
pub(crate) struct JobLimiter {
    max_memory_bytes: usize,
    max_table_elements: usize,
    max_instances: usize,
    current_memory_bytes: usize,
    pub(crate) peak_memory_bytes: usize,
    /// The size of the first memory growth this limiter refused.
    pub(crate) refused_memory_bytes: Option<usize>,
}

impl JobLimiter {
    pub(crate) fn new(max_memory_bytes: usize, max_table_elements: usize, max_instances: usize) -> Self {
        JobLimiter {
            max_memory_bytes,
            max_table_elements,
            max_instances,
            current_memory_bytes: 0,
            peak_memory_bytes: 0,
            refused_memory_bytes: None,
        }
    }
}

impl ResourceLimiter for JobLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.current_memory_bytes - current.min(self.current_memory_bytes) + desired;
        if total > self.max_memory_bytes {
            self.refused_memory_bytes.get_or_insert(total);
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
        self.max_instances * 4
    }

    fn memories(&self) -> usize {
        self.max_instances
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_past_the_limit_is_refused_and_remembered() {
        let mut limiter = JobLimiter::new(100, 10, 4);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(limiter.memory_growing(60, 90, None).unwrap());
        assert!(!limiter.memory_growing(90, 120, None).unwrap());
        assert_eq!(limiter.peak_memory_bytes, 90);
        assert_eq!(limiter.refused_memory_bytes, Some(120));
    }

    #[test]
    fn the_limit_covers_all_memories_together() {
        let mut limiter = JobLimiter::new(100, 10, 4);
        assert!(limiter.memory_growing(0, 60, None).unwrap());
        assert!(!limiter.memory_growing(0, 50, None).unwrap());
        assert!(limiter.memory_growing(0, 40, None).unwrap());
        assert_eq!(limiter.peak_memory_bytes, 100);
    }
}
