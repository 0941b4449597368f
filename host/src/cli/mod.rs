//! The `leash` command line: its arguments, its exit codes
//! ([`ExitStatus`]: every outcome maps to a documented one) and the
//! helpers its commands share; each command lives in `commands/`. It talks
//! to the sandbox and the runtime only through their public APIs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::job::grant::{self, AddressRange, HostRule, HttpGrant, HttpLimits, SecretName};
use crate::job::{Grants, Target};
use crate::sandbox::{self};
use crate::store::{Database, Durability};

/// Like `eprintln!`, but a closed stderr (a log pipe whose reader went
/// away) is ignored instead of aborting a worker mid-shutdown.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod commands;
mod exit;
pub(crate) mod parse;
mod process;
mod terminal;

use exit::EXIT_CODES_HELP;
pub use exit::{CliError, ExitStatus};
pub(crate) use parse::read_input;
pub use parse::{parse_duration, parse_size};
pub(crate) use terminal::{terminal_lines, terminal_text, terminal_width, write_output};

/// Durable, leased jobs inside WebAssembly sandboxes.
#[derive(Debug, Parser)]
#[command(name = "leash", version, about, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// A TOML file of settings; flags and LEASH_* variables override it.
    #[arg(long, global = true, env = "LEASH_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// Parse `args`, filling settings the command line and environment left
    /// at their defaults from the `--config` file. A bad file is a usage
    /// error naming the key.
    pub fn parse_with_config(args: Vec<std::ffi::OsString>) -> Result<Self, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let command = Cli::command();
        let usage = |message: String| Cli::command().error(clap::error::ErrorKind::InvalidValue, message);
        crate::config::check_env(&command).map_err(usage)?;
        let matches = command.clone().try_get_matches_from(&args)?;
        let Some(path) = matches.get_one::<PathBuf>("config").cloned() else {
            return Cli::from_arg_matches(&matches);
        };
        let mut pairs = crate::config::read_file(&path).map_err(usage)?;
        let mut args = args;
        // The settings of the innermost subcommand (`jobs list`, `serve`).
        let (mut current, mut current_matches) = (&command, &matches);
        while let Some((name, sub_matches)) = current_matches.subcommand()
            && let Some(sub) = current.find_subcommand(name)
        {
            (current, current_matches) = (sub, sub_matches);
        }
        // The older variable for the database still beats the file.
        let takes_db = current.get_arguments().any(|a| a.get_id() == "db");
        if takes_db && current_matches.value_source("db").is_none() && legacy_database_path().is_some() {
            pairs.retain(|(key, _)| key != "db");
        }
        if !std::ptr::eq(current, &command) {
            args.extend(crate::config::fill_defaults(current, current_matches, &path, &pairs).map_err(usage)?);
        }
        let matches = Cli::command().try_get_matches_from(&args)?;
        Cli::from_arg_matches(&matches)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a plugin component once, with no job store.
    ///
    /// The output bytes go to stdout; the plugin's logs, stdout and stderr go
    /// to stderr. The first Ctrl-C asks the plugin to stop; a second stops it
    /// at once.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(commands::RunArgs),
    /// Build a plugin project, run it, and again on every edit: one line
    /// per round with its outcome and times.
    ///
    /// Each round runs the project's build command, compiles the component
    /// (or reuses the compiled one when the build changed nothing), and
    /// runs it on the input file (read again every round, and watched)
    /// with the grants given here. Edits to build output, dependencies and
    /// version control (`target/`, `node_modules/`, `.git/`, `*.wasm`) are
    /// not edits. Ctrl-C stops.
    #[command(after_help = EXIT_CODES_HELP)]
    Dev(commands::DevArgs),
    /// Run a worker pool and the sweeps on a job database until SIGINT or
    /// SIGTERM, then shut down within the shutdown budget.
    Worker(commands::WorkerCommandArgs),
    /// Serve the HTTP API, with a worker pool and the sweeps in a child
    /// process it supervises (or in its own, `--pool in-process`), until
    /// SIGINT or SIGTERM.
    ///
    /// A pool process that dies is started again; the jobs it held are
    /// reclaimed at once, and a job under which two processes died is
    /// quarantined (`host_crash`). The API answers throughout.
    ///
    /// Every route but GET /healthz needs `Authorization: Bearer <token>`;
    /// the token is LEASH_API_TOKEN, or is generated on first start into
    /// the token file (mode 0600).
    Serve(commands::ServeArgs),
    /// Queue a job and print its id; `--wait` shows its progress, prints its
    /// output and exits with its outcome's exit code.
    #[command(after_help = EXIT_CODES_HELP)]
    Submit(commands::SubmitArgs),
    /// List, show, cancel, approve, reject, run, wait for and read the logs
    /// of jobs.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Jobs(commands::JobsCommand),
    /// Register, list, show, grant, gate, pause and resume plugins.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Plugins(commands::PluginsCommand),
    /// Rate limits: at most N starts per interval of the jobs that name
    /// one, across every process on the store; set, list, show, remove.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Limits(commands::LimitsCommand),
    /// Schedules: a job submitted at the times a cron expression names, or
    /// every interval; add, list, show, pause, resume, remove, trigger.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Schedules(commands::SchedulesCommand),
    /// Plans: an execute phase computes a change, a person approves it, an
    /// apply phase makes exactly that change.
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Plan(commands::PlanCommand),
    /// Principals: who may call the API, with which roles (admin).
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Principals(commands::PrincipalsCommand),
    /// Principals' API tokens: create (shown once), list, revoke (admin).
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Tokens(commands::TokensCommand),
    /// The principal this command acts as (its token's), and its roles.
    #[command(after_help = EXIT_CODES_HELP)]
    Whoami(commands::ConnArgs),
    /// The audit trail: who changed, submitted, decided or cancelled what;
    /// and a check of its hash chain (operate).
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Audit(commands::AuditCommand),
    /// Standing approval rules made by `leash jobs approve --remember`:
    /// list, show, revoke (approve).
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Rules(commands::RulesCommand),
    /// Health of the server (or local database): worker, queue depth,
    /// ceilings.
    #[command(after_help = EXIT_CODES_HELP)]
    Diagnostics(commands::DiagnosticsArgs),
    /// Create a plugin project in Rust, Python or JavaScript: source that
    /// greets, logs, reports progress and honours cancellation, the WIT it
    /// builds against, a README and a test.
    ///
    /// It writes into `./NAME` (or `--dir DIR/NAME`), which must not exist
    /// or be empty, and prints the commands that build, run and test it.
    New(commands::NewArgs),
}

/// What to run: a phase or an action, on some input.
#[derive(Debug, Args)]
struct JobArgs {
    /// Plan phase to run.
    #[arg(long, value_parser = ["execute", "apply"], conflicts_with = "action", default_value = "execute")]
    phase: String,
    /// Run a named action instead of a phase.
    #[arg(long, value_name = "NAME")]
    action: Option<String>,
    /// Input file, or `-` for stdin. Empty input when absent.
    #[arg(long, value_name = "FILE|-")]
    input: Option<String>,
}

/// A job's tags and metadata, as `leash submit` and `leash schedules add`
/// take them.
#[derive(Debug, Args)]
struct LabelArgs {
    /// A tag to find the job by, e.g. `env:prod` (repeat for more; at most
    /// 16).
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    /// A metadata entry to find the job by, `KEY=VALUE` (the value a
    /// string; repeat for more; at most 16).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse::parse_meta)]
    meta: Vec<(String, String)>,
}

/// A job's rate limit, as `leash submit` and `leash schedules add` take
/// it.
#[derive(Debug, Args)]
struct RateArgs {
    /// A rate limit the job's starts count against (`leash limits set`
    /// first): over it, the job waits for its slot.
    #[arg(long, value_name = "NAME")]
    rate_limit: Option<String>,
    /// The job's bucket within the limit: text with `{principal}`,
    /// `{plugin}` and `{input.FIELD}` in it, e.g. `{input.org}` (default:
    /// the limit's one bucket).
    #[arg(long, value_name = "TEMPLATE", requires = "rate_limit")]
    rate_key: Option<String>,
}

impl LabelArgs {
    /// The metadata as a JSON object of strings.
    fn metadata(&self) -> serde_json::Map<String, serde_json::Value> {
        self.meta.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect()
    }
}

impl JobArgs {
    fn target(&self) -> Result<Target, CliError> {
        match &self.action {
            Some(name) => Target::action(name).map_err(|e| CliError::usage(e.to_string())),
            None => self.phase.parse().map_err(|e: crate::job::ParseTargetError| CliError::usage(e.to_string())),
        }
    }
}

#[derive(Debug, Clone, Args, serde::Serialize, serde::Deserialize)]
struct StoreArgs {
    /// The job store: an SQLite file (a path or `sqlite:PATH`, created if
    /// missing) or `postgres://…`. Without it: `LEASH_DATABASE_PATH`, else
    /// `leash.db`.
    #[arg(long, env = "LEASH_DATABASE_URL", value_name = "PATH|URL")]
    db: Option<String>,
    /// `normal` survives a killed process; `full` also survives power loss.
    #[arg(long, env = "LEASH_DURABILITY", default_value = "normal", value_parser = ["normal", "full"])]
    durability: String,
}

#[derive(Debug, Clone, Args, serde::Serialize, serde::Deserialize)]
struct WorkerArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Job slots.
    #[arg(long, env = "LEASH_MAX_WORKERS", default_value_t = crate::runtime::DEFAULT_MAX_WORKERS)]
    max_workers: usize,
    /// Fallback poll for jobs from other processes.
    #[arg(long, env = "LEASH_POLL_INTERVAL", value_parser = parse_duration, default_value = "1s")]
    poll_interval: Duration,
    /// Lease length; renewed every third of it.
    #[arg(long, env = "LEASH_LEASE_TTL", value_parser = parse_duration, default_value = "30s")]
    lease_ttl: Duration,
    /// Retention of finished jobs.
    #[arg(long, env = "LEASH_JOB_TTL", value_parser = parse_duration, default_value = "86400s")]
    job_ttl: Duration,
    /// Retention of events: how far back a `GET /v1/events` client (or
    /// `leash jobs watch`) can resume.
    #[arg(long, env = "LEASH_EVENT_TTL", value_parser = parse_duration, default_value = "3600s")]
    event_ttl: Duration,
    /// Retention of audit rows (default: kept for ever). Older rows are
    /// deleted as one prefix of the chain; `leash audit verify` checks the
    /// rows kept from where they start.
    #[arg(long, env = "LEASH_AUDIT_TTL", value_parser = parse_duration)]
    audit_ttl: Option<Duration>,
    /// Grace between a cancel and a forced stop.
    #[arg(long, env = "LEASH_CANCEL_GRACE", value_parser = parse_duration, default_value = "5s")]
    cancel_grace: Duration,
    /// Everything shutdown does must fit in this.
    #[arg(long, env = "LEASH_SHUTDOWN_BUDGET", value_parser = parse_duration, default_value = "3s")]
    shutdown_budget: Duration,
    /// How long a job may wait in the queue (also after a requeue) before it
    /// fails as `expired`.
    #[arg(long, env = "LEASH_QUEUE_TTL", value_parser = parse_duration, default_value = "86400s")]
    queue_ttl: Duration,
    /// Queued jobs beyond which submits are refused (backpressure, HTTP 429).
    #[arg(long, env = "LEASH_MAX_QUEUED", default_value_t = crate::runtime::DEFAULT_MAX_QUEUED)]
    max_queued: u64,
    /// Wall-clock limit of a job that sets none.
    #[arg(long, env = "LEASH_JOB_TIMEOUT", value_parser = parse_duration, default_value = "3600s")]
    job_timeout: Duration,
    /// Ceiling on a job's wall-clock limit: longer submits are refused, and
    /// a stored job asking for more runs with this when claimed here.
    #[arg(long, env = "LEASH_MAX_TIMEOUT", value_parser = parse_duration, default_value = "86400s")]
    max_timeout: Duration,
    /// Attempts of a job that sets none: a lost lease or a `retryable`
    /// failure with attempts left runs it again after its backoff.
    #[arg(long, env = "LEASH_MAX_ATTEMPTS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::job::MAX_ATTEMPTS_CEILING)))]
    max_attempts: u32,
    /// Times a job that lost its lease before its attempt recorded any
    /// effect (so it provably touched nothing outside) runs again without
    /// spending an attempt; 0 makes a lost lease always spend one.
    #[arg(long, env = "LEASH_FREE_RERUNS", default_value_t = crate::runtime::DEFAULT_FREE_RERUNS,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(crate::job::MAX_ATTEMPTS_CEILING)))]
    free_reruns: u32,
    /// How long a job waiting for approval waits for a decision (and an
    /// approved job held for `leash jobs run`, for its run) before it fails
    /// as `expired`. Pinned on each job when it starts waiting.
    #[arg(long, env = "LEASH_APPROVAL_TTL", value_parser = parse_duration, default_value = "7d")]
    approval_ttl: Duration,
    /// The pause before a job's first retry (it doubles after each failure,
    /// with jitter), for jobs that set none.
    #[arg(long, env = "LEASH_RETRY_BACKOFF", value_parser = parse_duration, default_value = "1s")]
    retry_backoff: Duration,
    /// The longest pause before a retry, for jobs that set none.
    #[arg(long, env = "LEASH_RETRY_BACKOFF_CAP", value_parser = parse_duration, default_value = "300s")]
    retry_backoff_cap: Duration,
    /// Compiled-component cache. Default: $LEASH_CACHE_DIR, else ~/.cache/leash.
    #[arg(long, env = "LEASH_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// A file of `NAME=value` lines (mode 0600) with the secrets granted
    /// plugins may send; `LEASH_SECRET_<NAME>` variables set them too.
    #[arg(long, env = "LEASH_SECRETS_FILE", value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Operational log format on stderr: `text` (one line per event) or
    /// `json` (one JSON object per line, with the job's id, attempt, worker
    /// and plugin on job events). `LEASH_LOG` filters it like `RUST_LOG`
    /// (default `info`).
    #[arg(long, env = "LEASH_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Run guests at a lower CPU priority than the HTTP server, lease
    /// renewals and sweeps: a `nice` increment, 0 (default) to 19. It also
    /// yields the guests' CPU to every other process on the machine.
    #[arg(long, env = "LEASH_GUEST_NICE", default_value_t = 0,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    guest_nice: i32,
    /// Compile new plugins at a lower CPU priority than guests and the
    /// store: a `nice` increment, 0 to 19 (default 10). With cores to spare
    /// a compile runs at full speed; beside busy guests it gets a small
    /// share of the CPU, so they keep most of their throughput and it takes
    /// longer.
    #[arg(long, env = "LEASH_COMPILE_NICE", default_value_t = crate::sandbox::DEFAULT_COMPILE_NICE,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    compile_nice: i32,
    /// Bytes of each job slot's guest memory kept resident between jobs:
    /// the pages a job touched are reset in place for the next job instead
    /// of given back to the kernel, which spares each job the page faults
    /// and cross-core TLB flushes of touching them again (4.9x the raw
    /// sandbox rate on a trivial guest, BENCHMARKS.md). Costs up to this
    /// much resident memory per slot while idle; 0 gives every page back.
    #[arg(long, env = "LEASH_KEEP_RESIDENT", value_name = "SIZE", value_parser = parse_size, default_value = "1MiB")]
    keep_resident: u64,
    /// Bytes of compiled functions kept in the cache folder
    /// (`functions.db`, least recently used evicted first): a plugin that
    /// shares code with one compiled before (a second Python or
    /// JavaScript plugin, a rebuilt one) compiles only what differs. 0
    /// turns it off.
    #[arg(long, env = "LEASH_FUNCTION_CACHE_SIZE", value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    function_cache_size: u64,
    /// Bytes of compiled code kept in the store for every process (table
    /// `plugin_code`, least recently used dropped first): a worker that
    /// never compiled a plugin reads its code from there instead of
    /// compiling it. 0 keeps none. Default: 2GiB on PostgreSQL; 0 on
    /// SQLite, whose processes share one machine and its compile cache.
    #[arg(long, env = "LEASH_SHARED_CODE_SIZE", value_name = "SIZE", value_parser = parse_size)]
    shared_code_size: Option<u64>,
    /// Which compiler makes plugins' code: `tiered` (default: a large
    /// plugin's first jobs run on code from the quick baseline compiler,
    /// Winch, while the optimizing one, Cranelift, compiles it behind them
    /// and takes over), `cranelift` or `winch` alone.
    #[arg(long, env = "LEASH_COMPILER", default_value = "tiered", value_parser = ["tiered", "cranelift", "winch"])]
    compiler: String,
    /// Forward guest log records at or above this level to the host log
    /// (target `leash::guest`) when each attempt ends.
    #[arg(long, env = "LEASH_GUEST_LOGS", default_value = "off",
          value_parser = ["off", "error", "warn", "info", "debug", "trace"])]
    guest_logs: String,
    /// Append one line per guest start to FILE (`<job id> <attempt> <pid>`),
    /// written before the guest runs: an audit trail of what ran where.
    /// Several processes may share one file.
    #[arg(long, env = "LEASH_START_LOG", value_name = "FILE")]
    start_log: Option<PathBuf>,
}

/// What a plugin may reach over HTTP. Nothing unless granted.
#[derive(Debug, Clone, clap::Args)]
struct GrantArgs {
    /// Let the plugin send HTTP requests to a host:
    /// `[METHODS ]SCHEME://HOST[:PORT]`, e.g. `https://api.example.com`,
    /// `GET,HEAD https://*.example.com`, `POST http://127.0.0.1:8080`.
    /// Repeat for more hosts. Without any, every request is denied.
    #[arg(long = "allow-host", value_name = "RULE")]
    allow_host: Vec<HostRule>,
    /// A private address range (CIDR) a granted host name may resolve
    /// into, e.g. `10.0.0.0/8`. Loopback, private and link-local addresses
    /// are refused otherwise, unless a rule names the address itself.
    #[arg(long = "allow-private", value_name = "CIDR")]
    allow_private: Vec<AddressRange>,
    /// Most HTTP requests one job may send.
    #[arg(long, value_name = "N", default_value_t = grant::DEFAULT_HTTP_REQUESTS)]
    http_requests: u32,
    /// Largest HTTP response body a job may receive, e.g. `10MiB`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "64MiB")]
    http_response_limit: u64,
    /// Largest HTTP request body a job may send, e.g. `1MiB`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "16MiB")]
    http_request_limit: u64,
    /// Longest one HTTP request may take (never past the job's timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    http_timeout: Duration,
    /// A method that changes nothing upstream, so its requests are neither
    /// fenced by the lease nor recorded as effects. Repeat for more; given
    /// at all, it replaces the default set (GET and HEAD).
    #[arg(long = "safe-method", value_name = "METHOD", value_parser = grant::method_name)]
    safe_method: Vec<String>,
    /// A configuration value the plugin reads through `wasi:config/store`:
    /// `KEY=VALUE`. Repeat for more; the plugin sees these keys only.
    #[arg(long = "config-var", value_name = "KEY=VALUE", value_parser = parse_config_var)]
    config_var: Vec<(String, String)>,
    /// Let requests matching RULE carry the secret NAME, where a header
    /// value says `{secret:NAME}`: `NAME=RULE`, e.g.
    /// `GITHUB_TOKEN=https://api.github.com`. Repeat for more.
    #[arg(long = "secret", value_name = "NAME=RULE", value_parser = parse_secret_binding)]
    secret: Vec<(SecretName, HostRule)>,
}

fn parse_config_var(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?}: expected KEY=VALUE"))
}

fn parse_secret_binding(text: &str) -> Result<(SecretName, HostRule), String> {
    let (name, rule) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected NAME=RULE, e.g. GITHUB_TOKEN=https://api.github.com"))?;
    Ok((name.parse().map_err(|e| format!("{e}"))?, rule.parse().map_err(|e| format!("{e}"))?))
}

/// The process's secrets: `LEASH_SECRET_*` variables and `file`.
fn load_secrets(file: Option<&Path>) -> Result<Arc<sandbox::http::SecretStore>, CliError> {
    sandbox::http::SecretStore::load(std::env::vars(), file).map(Arc::new).map_err(CliError::usage)
}

impl GrantArgs {
    fn grants(&self) -> Grants {
        let mut http = HttpGrant {
            hosts: self.allow_host.clone(),
            private_ranges: self.allow_private.clone(),
            limits: HttpLimits {
                requests: self.http_requests,
                request_bytes: self.http_request_limit,
                response_bytes: self.http_response_limit,
                request_timeout: self.http_timeout,
            },
            ..HttpGrant::default()
        };
        if !self.safe_method.is_empty() {
            http.safe_methods = self.safe_method.clone();
        }
        for (name, rule) in &self.secret {
            http.bind_secret(name.clone(), rule.clone());
        }
        Grants { http, config: self.config_var.iter().cloned().collect() }
    }

    /// The grants, if any flag said anything.
    fn grants_given(&self) -> Option<Grants> {
        Some(self.grants()).filter(|g| !g.is_none())
    }
}

/// Run the parsed command line.
pub async fn run(cli: Cli) -> Result<ExitStatus, CliError> {
    match cli.command {
        Command::Run(args) => commands::run_once(args).await,
        Command::Dev(args) => commands::dev(args).await,
        Command::Worker(args) => match args.supervised_by {
            Some(supervisor) => commands::run_pool_process(supervisor).await,
            None => commands::run_worker(args.worker).await,
        },
        Command::Serve(args) => commands::serve(args).await,
        Command::Submit(args) => commands::submit(args).await,
        Command::Jobs(command) => commands::jobs(command).await,
        Command::Plugins(command) => commands::plugins(command).await,
        Command::Schedules(command) => commands::schedules(command).await,
        Command::Limits(command) => commands::limits(command).await,
        Command::Plan(command) => commands::plan(command).await,
        Command::Principals(command) => commands::principals(command).await,
        Command::Tokens(command) => commands::tokens(command).await,
        Command::Whoami(conn) => commands::whoami(conn).await,
        Command::Audit(command) => commands::audit(command).await,
        Command::Rules(command) => commands::rules(command).await,
        Command::Diagnostics(args) => commands::diagnostics(args).await,
        Command::New(args) => commands::new_plugin(args),
    }
}

fn durability(args: &StoreArgs) -> Result<Durability, CliError> {
    args.durability.parse().map_err(CliError::usage)
}

impl StoreArgs {
    /// `--db` / `LEASH_DATABASE_URL`, else `LEASH_DATABASE_PATH`, else `leash.db`.
    fn database(&self) -> Database {
        match &self.db {
            Some(db) => Database::parse(db),
            None => Database::Sqlite(legacy_database_path().unwrap_or_else(|| "leash.db".into())),
        }
    }
}

/// `LEASH_DATABASE_PATH`, the older name for an SQLite file's path.
fn legacy_database_path() -> Option<PathBuf> {
    std::env::var_os("LEASH_DATABASE_PATH").filter(|p| !p.is_empty()).map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::ErrorKind;

    #[test]
    fn guest_text_cannot_drive_the_terminal_or_start_a_line() {
        let forged = "\x1b]0;pwned\x07\x1b[2J\r\nleash: succeeded\u{202e}";
        let safe = terminal_text(forged);
        assert!(!safe.chars().any(|c| c.is_control() && c != '\t'), "{safe:?}");
        assert_eq!(safe, "\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{d}\\nleash: succeeded\\u{202e}");
        assert_eq!(terminal_text("plain text, tabs\tand ünïcödé"), "plain text, tabs\tand ünïcödé");
        let lines: Vec<String> = terminal_lines("one\ntwo\x1b[K").collect();
        assert_eq!(lines, ["one", "two\\u{1b}[K"]);
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86_400));
        assert!(parse_duration("5w").unwrap_err().contains("unit"));
    }

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("10MB").unwrap(), 10_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999GiB").unwrap_err().contains("out of range"));
    }

    #[test]
    fn the_worker_defaults_are_the_sandboxs() {
        use clap::Parser as _;
        let Command::Worker(commands::WorkerCommandArgs { worker: args, .. }) =
            Cli::try_parse_from(["leash", "worker"]).unwrap().command
        else {
            unreachable!("parsed as worker")
        };
        assert_eq!(args.keep_resident, crate::sandbox::DEFAULT_KEEP_RESIDENT_BYTES);
        assert_eq!(args.function_cache_size, crate::sandbox::DEFAULT_FUNCTION_CACHE_BYTES);
        assert_eq!(args.shared_code_size, None, "the backend's default");
        assert_eq!(args.compile_nice, crate::sandbox::DEFAULT_COMPILE_NICE);
        assert_eq!(args.compiler.parse::<crate::sandbox::Compiler>(), Ok(crate::sandbox::Compiler::Tiered));
    }

    #[test]
    fn every_error_kind_maps_to_its_documented_exit_status() {
        let documented = |kind: ErrorKind| match kind {
            ErrorKind::GuestError => 1,
            ErrorKind::InvalidInput => 2,
            ErrorKind::Timeout => 3,
            ErrorKind::Cancelled | ErrorKind::Rejected => 4,
            ErrorKind::OutOfFuel | ErrorKind::MemoryLimit | ErrorKind::OutputLimit | ErrorKind::ResourceLimit => 5,
            ErrorKind::Trap => 6,
            ErrorKind::HostCrash => 9,
            ErrorKind::Denied | ErrorKind::RateLimited => 7,
            ErrorKind::LeaseLost | ErrorKind::Expired | ErrorKind::Interrupted | ErrorKind::HostError => 70,
        };
        for kind in ErrorKind::ALL {
            assert_eq!(ExitStatus::for_kind(kind) as u8, documented(kind), "{kind}");
            // Every code a kind earns is one the help text explains.
            let line = format!("\n  {:<3} ", ExitStatus::for_kind(kind) as u8);
            assert!(EXIT_CODES_HELP.contains(&line), "{kind}: {line:?} not in the help");
        }
        // The limit kinds share one code; nothing else shares with them.
        let limits: Vec<ErrorKind> = ErrorKind::ALL.into_iter().filter(|k| k.is_resource_limit()).collect();
        assert_eq!(limits.len(), 4);
        assert!(ErrorKind::ALL.into_iter().all(|k| k.is_resource_limit() == (ExitStatus::for_kind(k) as u8 == 5)));
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
