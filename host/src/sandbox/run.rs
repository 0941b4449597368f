//! One run: a fresh store with the job's limits, WASI with nothing
//! granted, the call raced against its timeout and stop requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use wasmtime::component::ResourceTable;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::WasiCtxBuilder;

use crate::job::{ErrorKind, Target};
use crate::sandbox::capture::CapturedOutput;
use crate::sandbox::http::HttpGate;
use crate::sandbox::journal::{Journal, LogBook, RunObserver, cut_text};
use crate::sandbox::limiter::JobLimiter;
use crate::sandbox::outcome::{Captured, Ended, Failure, Interrupted, Outcome, Usage, classify};
use crate::sandbox::request::{RunRequest, hostcall_fuel};
use crate::sandbox::state::HostState;
use crate::sandbox::stop::StopHandle;
use crate::sandbox::{
    MAX_ERROR_MESSAGE_BYTES, MAX_RANDOM_BYTES, MAX_RESOURCE_HANDLES, MAX_TABLE_ELEMENTS, Plugin, Sandbox, bindings,
    watch_stop,
};

impl Sandbox {
    /// Run `plugin` once in a fresh store. Never fails: every ending,
    /// including host-side trouble, is an [`Outcome`].
    pub async fn run(
        &self,
        plugin: &Plugin,
        request: RunRequest,
        stop: &StopHandle,
        observer: Arc<dyn RunObserver>,
    ) -> Outcome {
        let started = Instant::now();
        let limits = &request.limits;
        let deadline = started + limits.timeout;
        let redactor = Arc::new(self.config.secrets.redactor(&request.grants.http));
        // Kept past the cap by the widest form of a secret, so a value
        // straddling the cut is cleaned before it is cut.
        let stdout = CapturedOutput::new(limits.capture_bytes, redactor.widest());
        let stderr = CapturedOutput::new(limits.capture_bytes, redactor.widest());
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let memory_limit =
            usize::try_from(limits.memory_bytes.min(self.config.memory_ceiling_bytes)).unwrap_or(usize::MAX);
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCE_HANDLES);
        let book = LogBook::new(limits.log_records, limits.log_bytes);
        let journal = Journal::new(book, observer, started, redactor.clone());
        let http = HttpGate::new(
            request.grants.clone(),
            self.config.secrets.clone(),
            request.effects.clone(),
            request.egress.clone(),
            request.fence.clone(),
            journal.clone(),
            deadline,
        );
        let http_meter = http.meter();
        let trip = http.trip();
        let state = HostState {
            wasi,
            table,
            limiter: JobLimiter::new(memory_limit, MAX_TABLE_ELEMENTS, &self.config.components, stderr.clone()),
            journal,
            last_progress: None,
            stop: stop.clone(),
            http_ctx: wasmtime_wasi_http::WasiHttpCtx::new(),
            http,
            config: request.grants.config.iter().collect(),
        };
        // The code of the plugin's best tier so far, and its engine.
        let code = plugin.code();
        let mut store = Store::new(code.pre.engine(), state);
        store.limiter(|s| &mut s.limiter);
        // Bounds what wasmtime copies out of the guest for one call (a log
        // record, the output) before leash can look at it.
        store.set_hostcall_fuel(hostcall_fuel(limits));
        let fuel_budget = limits.fuel.unwrap_or(u64::MAX);
        if self.config.fuel {
            // Fuel is on for this engine, so setting it cannot fail.
            let _ = store.set_fuel(fuel_budget);
        }
        let forced = stop.clone();
        let interrupt = Arc::new(AtomicBool::new(false));
        let interrupt_requested = interrupt.clone();
        let tripped = trip.clone();
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                return Err(Interrupted::Timeout.into());
            }
            if tripped.is_tripped() {
                return Err(Interrupted::RateLimited.into());
            }
            if forced.is_forced() || interrupt_requested.load(Ordering::Relaxed) {
                return Err(Interrupted::Forced.into());
            }
            // Yield every tick so a computing guest never holds its thread.
            Ok(UpdateDeadline::Yield(1))
        });
        store.set_epoch_deadline(1);

        let ctx = bindings::leash::plugin::types::JobContext {
            job_id: request.job_id.clone(),
            target: match &request.target {
                Target::Execute => bindings::leash::plugin::types::Target::Execute,
                Target::Apply => bindings::leash::plugin::types::Target::Apply,
                Target::Action(name) => bindings::leash::plugin::types::Target::Action(name.clone()),
            },
            attempt: request.attempt,
            deadline_unix_ms: unix_ms(SystemTime::now() + limits.timeout),
        };

        let ended = {
            let call = async {
                let instance = code.pre.instantiate_async(&mut store).await?;
                instance.call_run(&mut store, &ctx, &request.input).await
            };
            tokio::pin!(call);
            tokio::select! {
                biased;
                result = &mut call => Ended::Returned(result),
                // A request's rate slot is past the deadline: the guest
                // waits in that request, so its call is dropped at once.
                _ = trip.tripped() => Ended::Interrupted(Interrupted::RateLimited),
                why = watch_stop(deadline, stop, limits.cancel_grace) => {
                    // Let the epoch callback trap a computing guest first, so it
                    // ends the way every other trap does. A guest blocked in a
                    // host call or a WASI sleep never reaches the callback: drop
                    // its call after a few ticks.
                    interrupt.store(true, Ordering::Relaxed);
                    tokio::select! {
                        biased;
                        result = &mut call => Ended::Returned(result),
                        _ = tokio::time::sleep(self.config.epoch_tick * 3) => Ended::Interrupted(why),
                    }
                }
            }
        };

        let fuel_used = if self.config.fuel { fuel_budget - store.get_fuel().unwrap_or(0) } else { 0 };
        let mut state = store.into_data();
        let mut result = classify(ended, &state, limits, stop.is_requested(), &stderr, plugin.names.as_deref());
        // A proposal the grant refused fails the execute phase, whatever
        // the guest made of the refusal.
        let book = std::mem::take(&mut state.http.book);
        if let (Ok(_), Some(why)) = (&result, book.refused) {
            result = Err(Failure::new(
                ErrorKind::GuestError,
                format!("GuestError: the execute phase proposed an effect its grant refuses: {why}"),
            ));
        }
        // A run its rate limits ended fails with their reason, whatever
        // the guest was doing when it was stopped.
        if let (Err(failure), Some(limited)) = (&mut result, trip.limited()) {
            *failure = Failure {
                retryable: true,
                retry_after: Some(limited.after),
                ..Failure::new(ErrorKind::RateLimited, limited.message)
            };
        }
        let proposals = if result.is_ok() { book.proposals } else { Vec::new() };
        // Nothing the host keeps of the run holds a secret's value in
        // clear, whatever the guest got back and passed on; texts are
        // cleaned first and cut after.
        match &mut result {
            Ok(output) => *output = redactor.bytes(std::mem::take(output)),
            Err(failure) => {
                for text in [Some(&mut failure.message), failure.backtrace.as_mut()].into_iter().flatten() {
                    redactor.clean(text);
                }
                failure.message = cut_text(std::mem::take(&mut failure.message), MAX_ERROR_MESSAGE_BYTES);
            }
        }
        let (logs, logs_dropped) = state.journal.take();
        // Requests still in flight end with the store's resources.
        drop(state.table);
        let (http_requests, http_denied) = http_meter.counts();
        let (stdout_bytes, stdout_dropped) = stdout.take_cleaned(&redactor);
        let (stderr_bytes, stderr_dropped) = stderr.take_cleaned(&redactor);
        Outcome {
            result,
            usage: Usage {
                fuel_used,
                peak_memory_bytes: state.limiter.peak_memory_bytes as u64,
                duration: started.elapsed(),
                http_requests,
                http_denied,
                tier: code.tier,
            },
            logs,
            logs_dropped,
            last_progress: state.last_progress,
            stdout: Captured { bytes: stdout_bytes, dropped: stdout_dropped },
            stderr: Captured { bytes: stderr_bytes, dropped: stderr_dropped },
            proposals,
        }
    }
}

pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
