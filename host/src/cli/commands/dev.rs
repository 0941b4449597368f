//! `leash dev`: the plugin author's loop. Build the project with its own
//! build command, run the component on the saved input with the saved
//! grants, print one line, and do it again whenever a source changes. The
//! sandbox and the compiled components stay in the process (and in the
//! compile cache), so a rebuild that changes nothing runs at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use clap::Args;
use notify::Watcher as _;

use super::run::{SandboxArgs, granted_to, plan_fence, status_name};
use super::show::human_duration;
use crate::cli::process::interrupt_signal;
use crate::cli::{CliError, ExitStatus, GrantArgs, JobArgs, read_input, terminal_lines, terminal_text};
use crate::job::Digest;
use crate::sandbox::{NoObserver, Plugin, RunRequest, Sandbox, StopHandle};

#[derive(Debug, Args)]
pub(in crate::cli) struct DevArgs {
    /// The plugin project.
    #[arg(default_value = ".", value_name = "DIR")]
    dir: PathBuf,
    /// The build command, run with `sh -c` in the project. Default: the
    /// one `leash new` gives the project's language (a `Cargo.toml`:
    /// `cargo build --release --target wasm32-wasip2`; a `package.json`:
    /// `npm run build`; an `app.py`: `componentize-py … -o DIR.wasm`).
    #[arg(long, value_name = "COMMAND")]
    build: Option<String>,
    /// The component the build writes. Default: where the default build
    /// puts it (for Rust, as `cargo metadata` reports the target folder).
    #[arg(long, value_name = "FILE")]
    wasm: Option<PathBuf>,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    #[command(flatten)]
    grants: GrantArgs,
    /// Run the phase as a plan's: an execute run sends no effect and
    /// proposes them (each round's line counts them; `--verbose` lists
    /// them), as `leash run --plan` does.
    #[arg(long)]
    plan: bool,
    /// Build and run once, then exit with the run's exit code.
    #[arg(long)]
    once: bool,
    /// Also print each run's logs, stdout and stderr, and its whole output.
    #[arg(long)]
    verbose: bool,
}

/// A line on stdout; a reader that went away (`| head`) ends nothing.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// How a project builds and where its component lands.
#[derive(Debug)]
struct Project {
    dir: PathBuf,
    build: String,
    wasm: PathBuf,
}

/// Folders and files a change in which is not an edit: build output,
/// dependencies, version control, caches, the component itself.
fn ignored(path: &Path, wasm: &Path) -> bool {
    let skip_dir = |c: &std::ffi::OsStr| {
        matches!(c.to_str(), Some("target" | "node_modules" | ".git" | "__pycache__" | ".mypy_cache"))
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    path == wasm
        || path.components().any(|c| skip_dir(c.as_os_str()))
        || name.ends_with(".wasm")
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.starts_with(".#")
}

/// The build command and component of a project `leash new` could have
/// written, unless given.
fn project(args: &DevArgs) -> Result<Project, CliError> {
    let dir = args.dir.canonicalize().map_err(|e| CliError::usage(format!("{}: {e}", args.dir.display())))?;
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("plugin").to_owned();
    let (build, wasm) = if dir.join("Cargo.toml").is_file() {
        let wasm = match &args.wasm {
            Some(wasm) => wasm.clone(),
            None => cargo_component(&dir)?,
        };
        ("cargo build --release --target wasm32-wasip2".to_owned(), wasm)
    } else if dir.join("package.json").is_file() {
        let wasm = args.wasm.clone().unwrap_or_else(|| npm_component(&dir, &name));
        ("npm run build".to_owned(), wasm)
    } else if dir.join("app.py").is_file() {
        let wasm = args.wasm.clone().unwrap_or_else(|| PathBuf::from(format!("{name}.wasm")));
        (format!("componentize-py -d wit -w plugin-http componentize app -o {name}.wasm"), wasm)
    } else {
        let given = args.build.clone().zip(args.wasm.clone());
        given.ok_or_else(|| {
            CliError::usage(format!(
                "{} has no Cargo.toml, package.json or app.py: say how it builds with --build COMMAND and \
                 --wasm FILE",
                dir.display()
            ))
        })?
    };
    let build = args.build.clone().unwrap_or(build);
    let wasm = if wasm.is_absolute() { wasm } else { dir.join(wasm) };
    Ok(Project { dir, build, wasm })
}

/// Where `cargo build --release --target wasm32-wasip2` puts the crate's
/// component: the target folder `cargo metadata` reports (so a workspace
/// or `CARGO_TARGET_DIR` is found), named after its `cdylib` target.
fn cargo_component(dir: &Path) -> Result<PathBuf, CliError> {
    let output = std::process::Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(dir)
        .output()
        .map_err(|e| CliError::usage(format!("cannot run cargo metadata: {e}")))?;
    if !output.status.success() {
        return Err(CliError::usage(format!(
            "cargo metadata failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|e| CliError::internal(format!("cargo metadata: {e}")))?;
    let manifest = dir.join("Cargo.toml");
    let package = metadata["packages"].as_array().into_iter().flatten().find(|p| {
        p["manifest_path"].as_str().and_then(|m| Path::new(m).canonicalize().ok()).as_deref() == Some(&manifest)
    });
    let target = package.and_then(|p| {
        p["targets"]
            .as_array()?
            .iter()
            .find(|t| t["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib")))
    });
    let (Some(folder), Some(target)) = (metadata["target_directory"].as_str(), target) else {
        return Err(CliError::usage(format!(
            "{} builds no cdylib (a plugin's Cargo.toml has [lib] crate-type = [\"cdylib\"]): say which component \
             to run with --wasm FILE",
            manifest.display()
        )));
    };
    let file = target["name"].as_str().unwrap_or_default().replace('-', "_");
    Ok(Path::new(folder).join("wasm32-wasip2/release").join(format!("{file}.wasm")))
}

/// The file a `package.json` build script writes with `-o FILE`, else
/// `NAME.wasm`.
fn npm_component(dir: &Path, name: &str) -> PathBuf {
    let package: serde_json::Value =
        std::fs::read(dir.join("package.json")).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    let script = package["scripts"]["build"].as_str().unwrap_or_default();
    let words: Vec<&str> = script.split_whitespace().collect();
    let out = words.windows(2).find(|w| w[0] == "-o" || w[0] == "--out").map(|w| w[1].to_owned());
    PathBuf::from(out.unwrap_or_else(|| format!("{name}.wasm")))
}

/// Every watched file's modification time and size: what decides whether
/// a wake-up was an edit (a build that rewrites a lock file the same way
/// changes nothing here after its first run).
fn snapshot(project: &Project, input: Option<&Path>) -> Snapshot {
    let mut seen = BTreeMap::new();
    let mut stack = vec![project.dir.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if ignored(&path, &project.wasm) {
                continue;
            }
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(path),
                Ok(m) => {
                    seen.insert(path, (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
                }
                Err(_) => {}
            }
        }
    }
    if let Some(input) = input
        && let Ok(m) = std::fs::metadata(input)
    {
        seen.insert(input.to_path_buf(), (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
    }
    seen
}

/// How long the watched files must be still before a round starts.
const QUIET: Duration = Duration::from_millis(150);

/// Compiled components kept warm, most recent last: going back to an
/// earlier build runs without compiling.
const KEPT: usize = 4;

/// Watched files as they were.
type Snapshot = BTreeMap<PathBuf, (SystemTime, u64)>;

/// One round: build, compile (or reuse), run, and the line that says how
/// it went. Returns the run's exit status (a failed build is a usage
/// error) and the watched files as the build left them: an edit after
/// that, even during the run, starts the next round.
async fn round(
    n: u32,
    args: &DevArgs,
    project: &Project,
    input: Option<&Path>,
    sandbox: &Arc<Sandbox>,
    warm: &mut Vec<(Digest, Plugin)>,
) -> (ExitStatus, Snapshot) {
    let started = Instant::now();
    let built = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&project.build)
        .current_dir(&project.dir)
        .stdin(std::process::Stdio::null())
        .output()
        .await;
    let took = human_duration(started.elapsed());
    let settled = snapshot(project, input);
    let status = run_built(n, args, project, built, took, sandbox, warm).await;
    (status, settled)
}

/// The rest of a round once its build has ended.
async fn run_built(
    n: u32,
    args: &DevArgs,
    project: &Project,
    built: std::io::Result<std::process::Output>,
    took: String,
    sandbox: &Arc<Sandbox>,
    warm: &mut Vec<(Digest, Plugin)>,
) -> ExitStatus {
    let built = match built {
        Ok(output) if output.status.success() => output,
        Ok(output) => {
            out!("#{n} build failed in {took} ({}); its output:", output.status);
            let text = [String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)].concat();
            let lines: Vec<String> = terminal_lines(&text).collect();
            for line in &lines[lines.len().saturating_sub(40)..] {
                out!("  {line}");
            }
            return ExitStatus::Usage;
        }
        Err(e) => {
            out!("#{n} cannot run the build `{}`: {e}", project.build);
            return ExitStatus::Usage;
        }
    };
    if args.verbose {
        for line in terminal_lines(&String::from_utf8_lossy(&built.stderr)) {
            say!("[build] {line}");
        }
    }
    let mut line = format!("#{n} built in {took}");
    let bytes = match std::fs::read(&project.wasm) {
        Ok(bytes) => bytes,
        Err(e) => {
            out!("{line} · cannot read {}: {e} (say where the build writes it with --wasm)", project.wasm.display());
            return ExitStatus::Usage;
        }
    };
    let digest = Digest::of(&bytes);
    let plugin = match warm.iter().position(|(d, _)| *d == digest) {
        Some(at) => {
            line.push_str(" · unchanged component");
            let kept = warm.remove(at);
            warm.push(kept);
            warm.last().map(|(_, p)| p.clone())
        }
        None => match sandbox.compile(Arc::new(bytes.clone())).await {
            Ok(plugin) => {
                let loaded = plugin.loaded();
                let how = loaded.how();
                line.push_str(&format!(" · {how} in {}{}", human_duration(loaded.duration), loaded.reuse_note()));
                warm.push((digest, plugin.clone()));
                if warm.len() > KEPT {
                    warm.remove(0);
                }
                Some(plugin)
            }
            Err(e) => {
                out!("{line} · refused: {}", terminal_text(&e.to_string()));
                return ExitStatus::Usage;
            }
        },
    };
    let Some(plugin) = plugin else { return ExitStatus::Usage };
    // Read again each round: an edited input file is a change too.
    let prepared = read_input(args.job.input.as_deref()).and_then(|input| {
        let grants = granted_to(&bytes, args.grants.grants(), &project.wasm)?;
        Ok((input, args.job.target()?, grants))
    });
    let (input, target, grants) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            out!("{line} · {e}");
            return ExitStatus::Usage;
        }
    };
    let fence = plan_fence(args.plan, &target, None);
    let request =
        RunRequest { grants: Arc::new(grants), fence, ..RunRequest::new(target, input, args.sandbox.limits()) };
    let outcome = sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)).await;
    let ran = human_duration(outcome.usage.duration);
    let said = match &outcome.result {
        Ok(output) => {
            let text = terminal_text(&String::from_utf8_lossy(output));
            let proposed = match outcome.proposals.len() {
                0 if !args.plan => String::new(),
                n => format!(" · {n} proposed"),
            };
            format!("{line} · {} in {ran}{proposed} · {}", status_name(&outcome), one_line(&text, args.verbose))
        }
        Err(failure) => format!(
            "{line} · {} ({}) in {ran} · {}",
            status_name(&outcome),
            failure.kind,
            one_line(&terminal_text(&failure.message), args.verbose)
        ),
    };
    if args.verbose {
        for p in &outcome.proposals {
            say!("[proposed] {} ({} bytes)", terminal_text(&p.shown()), p.body.len());
        }
        for record in &outcome.logs {
            let fields: String =
                record.fields.iter().map(|(k, v)| format!(" {}={}", terminal_text(k), terminal_text(v))).collect();
            say!("[{}] {}{fields}", record.level.as_str(), terminal_text(&record.message));
        }
        for (name, captured) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
            for line in terminal_lines(&String::from_utf8_lossy(&captured.bytes)) {
                say!("[guest {name}] {line}");
            }
        }
    }
    out!("{said}");
    outcome.error_kind().map_or(ExitStatus::Success, ExitStatus::for_kind)
}

/// Text cut to one terminal line's worth, unless all of it is asked for.
fn one_line(text: &str, whole: bool) -> String {
    const MOST: usize = 160;
    if whole || text.chars().count() <= MOST {
        return text.to_owned();
    }
    format!("{}… ({} bytes; --verbose shows it all)", text.chars().take(MOST).collect::<String>(), text.len())
}

pub(in crate::cli) async fn dev(args: DevArgs) -> Result<ExitStatus, CliError> {
    if args.job.input.as_deref() == Some("-") {
        return Err(CliError::usage("leash dev reads its input again for every run: give a file, not `-`"));
    }
    let grants = args.grants.grants();
    grants.check().map_err(CliError::usage)?;
    args.job.target()?;
    let project = project(&args)?;
    let input = args.job.input.as_deref().map(|i| std::path::absolute(i).unwrap_or_else(|_| PathBuf::from(i)));
    let sandbox = args.sandbox.sandbox()?;
    let mut warm = Vec::new();
    if args.once {
        return Ok(round(1, &args, &project, input.as_deref(), &sandbox, &mut warm).await.0);
    }

    let (tx, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let wasm = project.wasm.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && event.paths.iter().any(|p| !ignored(p, &wasm))
        {
            let _ = tx.send(());
        }
    })
    .map_err(|e| CliError::internal(format!("cannot watch {}: {e}", project.dir.display())))?;
    watcher
        .watch(&project.dir, notify::RecursiveMode::Recursive)
        .map_err(|e| CliError::internal(format!("cannot watch {}: {e}", project.dir.display())))?;
    if let Some(input) = input.as_deref().filter(|i| !i.starts_with(&project.dir))
        && let Some(parent) = input.parent()
    {
        watcher
            .watch(parent, notify::RecursiveMode::NonRecursive)
            .map_err(|e| CliError::internal(format!("cannot watch {}: {e}", parent.display())))?;
    }
    say!("leash: dev on {} (build: {}); Ctrl-C stops", project.dir.display(), project.build);
    let mut interrupts = interrupt_signal()?;
    let mut n = 0;
    loop {
        n += 1;
        let settled = tokio::select! {
            (_, settled) = round(n, &args, &project, input.as_deref(), &sandbox, &mut warm) => settled,
            // The round, and the guest's run with it, is dropped.
            _ = interrupts.recv() => return Ok(ExitStatus::Success),
        };
        // The next round starts when a watched file differs from what the
        // build left; file events only say when to look.
        while snapshot(&project, input.as_deref()) == settled {
            tokio::select! {
                _ = changes.recv() => {}
                _ = interrupts.recv() => return Ok(ExitStatus::Success),
            }
            // An editor's save is several events (a truncate, then the
            // write): wait until the files have been quiet for a moment.
            while tokio::time::timeout(QUIET, changes.recv()).await.is_ok_and(|event| event.is_some()) {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_output_and_dependencies_are_not_edits() {
        let wasm = Path::new("/p/hello.wasm");
        for path in ["/p/target/release/x.rs", "/p/node_modules/a/b.js", "/p/.git/index", "/p/x.wasm", "/p/a.py~"] {
            assert!(ignored(Path::new(path), wasm), "{path}");
        }
        for path in ["/p/src/lib.rs", "/p/app.py", "/p/app.js", "/p/Cargo.toml", "/p/input.json"] {
            assert!(!ignored(Path::new(path), wasm), "{path}");
        }
    }
}
