//! The guests' own tokio runtime, so CPU-bound guests never hold the
//! threads the HTTP server, lease renewals and sweeps run on.

/// The threads guests run on: a multi-threaded tokio runtime of its own,
/// one thread per core (at most one per slot), optionally at a lower CPU
/// priority than the process's other threads. The HTTP server, lease
/// renewals, progress writes and sweeps stay on the caller's runtime, so a
/// pool full of computing guests delays them by an OS time slice at most,
/// not by a guest's turn on a shared worker thread.
#[derive(Debug)]
pub(super) struct GuestRuntime(Option<tokio::runtime::Runtime>);

impl GuestRuntime {
    /// `None` when the threads cannot be started: guests then run on the
    /// caller's runtime, as without isolation.
    pub(super) fn start(slots: usize, nice: i32) -> Option<GuestRuntime> {
        let nice = nice.clamp(0, 19);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores.min(slots).max(1))
            .thread_name("leash-guest")
            .enable_all()
            .on_thread_start(move || crate::sandbox::lower_thread_priority(nice))
            .build();
        match runtime {
            Ok(runtime) => Some(GuestRuntime(Some(runtime))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the guest threads; guests share the control plane's");
                None
            }
        }
    }

    pub(super) fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("present until dropped").handle()
    }
}

impl Drop for GuestRuntime {
    fn drop(&mut self) {
        // Dropped from async code: never block on the guest threads.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}
