//! What each job's store holds, and the host side of the `host` interface.

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::leash::plugin::{host, plan, types};
use super::http::HttpGate;
use super::journal::{Journal, LogLevel, Progress};
use super::limiter::JobLimiter;
use super::stop::StopHandle;

/// The data of one job's store.
pub(crate) struct HostState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: JobLimiter,
    pub(crate) journal: Journal,
    pub(crate) last_progress: Option<Progress>,
    pub(crate) stop: StopHandle,
    pub(crate) http_ctx: WasiHttpCtx,
    pub(crate) http: HttpGate,
    /// The granted configuration, all `wasi:config/store` shows.
    pub(crate) config: wasmtime_wasi_config::WasiConfigVariables,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http_ctx, table: &mut self.table, hooks: &mut self.http }
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
        self.journal.record(level, message, fields);
    }

    async fn progress(&mut self, done: u64, total: u64, note: String) -> bool {
        let progress = self.journal.progress(done, total, note);
        self.last_progress = Some(progress);
        self.stop.is_requested()
    }

    async fn cancelled(&mut self) -> bool {
        self.stop.is_requested()
    }
}

impl plan::Host for HostState {
    async fn propose(&mut self, effect: plan::Effect) -> Result<u32, String> {
        self.http.propose(effect.method, effect.url, effect.headers, effect.body).await
    }

    async fn approved(&mut self) -> Vec<(u32, plan::Effect)> {
        self.http
            .approved()
            .into_iter()
            .map(|p| (p.n, plan::Effect { method: p.method, url: p.url, headers: p.headers, body: p.body }))
            .collect()
    }
}
