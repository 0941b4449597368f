//! The Python and JavaScript example plugins (`plugins/python/*`,
//! `plugins/js/*`), built from source with the pinned toolchains on first
//! use and cached under `plugins/target/polyglot/` by a hash of everything
//! that goes into them (source, SDK, WIT, tool version).
//!
//! The tools are not cargo's: componentize-py 0.25 from PyPI
//! (`guest-sdk/python/requirements.txt`) and componentize-js 0.23 from npm
//! (`guest-sdk/js/package.json`, installed with `npm ci --prefix
//! guest-sdk/js`; it also pins `@bytecodealliance/preview2-shim`, which
//! componentize-js 0.23 imports without declaring it). Where one is missing, [`guest`] says the test is skipped
//! and why; with `CI` or `LEASH_TEST_POLYGLOT` set it fails instead, so CI
//! (whose `.ci/run` installs both) never skips them.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

/// A guest language other than Rust.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    /// componentize-py.
    Python,
    /// componentize-js.
    Js,
}

impl Lang {
    /// Both, for tests that run the same case in each.
    pub const ALL: [Lang; 2] = [Lang::Python, Lang::Js];

    /// The folder under `plugins/` and the name `leash new --lang` takes.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Js => "js",
        }
    }

    fn source_file(self) -> &'static str {
        match self {
            Lang::Python => "app.py",
            Lang::Js => "app.js",
        }
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace root").to_path_buf()
}

/// Whether a missing tool fails the test rather than skipping it.
pub fn required() -> bool {
    ["CI", "LEASH_TEST_POLYGLOT"].iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// A tool that builds guests of one language.
#[derive(Debug, Clone)]
pub struct Tool {
    /// The program to run.
    pub program: PathBuf,
    /// What `--version` printed.
    pub version: String,
}

/// Where the language's tool is and its version, or why it cannot be used.
pub fn tool(lang: Lang) -> Result<Tool, String> {
    static TOOLS: OnceLock<Mutex<HashMap<Lang, Result<Tool, String>>>> = OnceLock::new();
    let tools = TOOLS.get_or_init(Mutex::default);
    tools.lock().unwrap_or_else(|e| e.into_inner()).entry(lang).or_insert_with(|| find_tool(lang)).clone()
}

fn find_tool(lang: Lang) -> Result<Tool, String> {
    let (program, install) = match lang {
        Lang::Python => (
            std::env::var_os("LEASH_COMPONENTIZE_PY").map_or_else(|| PathBuf::from("componentize-py"), PathBuf::from),
            "python3 -m pip install -r guest-sdk/python/requirements.txt",
        ),
        Lang::Js => {
            let local = root().join("guest-sdk/js/node_modules/.bin/componentize-js");
            (if local.exists() { local } else { PathBuf::from("componentize-js") }, "npm ci --prefix guest-sdk/js")
        }
    };
    let output = Command::new(&program)
        .arg("--version")
        .output()
        .map_err(|e| format!("{} is not installed ({e}); install it with `{install}`", program.display()))?;
    if !output.status.success() {
        return Err(format!("`{} --version` failed; reinstall it with `{install}`", program.display()));
    }
    let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Ok(Tool { program, version })
}

/// Say on the process's stderr (the harness captures a passing test's
/// `eprintln!`) that the running test is skipped, and why.
pub fn say_skipped(why: &str) {
    let test = std::thread::current().name().unwrap_or("a polyglot test").to_owned();
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
}

/// The built example `plugins/<lang>/<name>`, or `None` after saying why
/// the test is skipped (its tool is missing and not [`required`]).
///
/// # Panics
/// If the build fails, or the tool is missing where it is required.
pub fn guest(lang: Lang, name: &str) -> Option<PathBuf> {
    let tool = match tool(lang) {
        Ok(tool) => tool,
        Err(why) if required() => panic!("CI or LEASH_TEST_POLYGLOT is set, so this test must not be skipped: {why}"),
        Err(why) => {
            say_skipped(&why);
            return None;
        }
    };
    let dir = root().join("plugins").join(lang.name()).join(name);
    Some(built(lang, &tool, &dir).unwrap_or_else(|e| panic!("building {}: {e}", dir.display())))
}

/// The bytes of [`guest`].
pub fn guest_bytes(lang: Lang, name: &str) -> Option<Vec<u8>> {
    let path = guest(lang, name)?;
    Some(std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())))
}

/// Build `dir` once per process (and once per content, across processes).
fn built(lang: Lang, tool: &Tool, dir: &Path) -> Result<PathBuf, String> {
    type Slot = Arc<OnceLock<Result<PathBuf, String>>>;
    static BUILDS: OnceLock<Mutex<HashMap<PathBuf, Slot>>> = OnceLock::new();
    let slot = BUILDS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(dir.to_path_buf())
        .or_default()
        .clone();
    slot.get_or_init(|| build(lang, tool, dir)).clone()
}

fn build(lang: Lang, tool: &Tool, dir: &Path) -> Result<PathBuf, String> {
    let root = root();
    let wit = root.join("wit");
    let sdk = match lang {
        Lang::Python => root.join("guest-sdk/python/leash.py"),
        Lang::Js => root.join("guest-sdk/js/leash.js"),
    };
    let source = dir.join(lang.source_file());
    // What componentize-js leaves out: `-d` and this file's words, else
    // only the wasi:http server export (outbound HTTP stays).
    let disable = dir.join("disable");
    let disabled = std::fs::read_to_string(&disable).unwrap_or_else(|_| "fetch-event".to_owned());
    let mut hash = Sha256::new();
    hash.update(tool.version.as_bytes());
    hash.update(disabled.as_bytes());
    let mut inputs = vec![source.clone(), sdk.clone()];
    let mut dirs = vec![wit.clone()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let mut paths: Vec<PathBuf> =
            entries.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        paths.sort();
        for path in paths {
            if path.is_dir() { dirs.push(path) } else { inputs.push(path) }
        }
    }
    for file in &inputs {
        hash.update(file.strip_prefix(&root).unwrap_or(file).to_string_lossy().as_bytes());
        hash.update(std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?);
    }
    let name = dir.file_name().and_then(|n| n.to_str()).ok_or("plugin folder has no name")?;
    let out_dir = root.join("plugins/target/polyglot");
    let out = out_dir.join(format!("{}-{name}-{}.wasm", lang.name(), &hex::encode(hash.finalize())[..16]));
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let stage = tempfile::tempdir_in(&out_dir).map_err(|e| format!("cannot make a build folder: {e}"))?;
    let staged = stage.path().join("out.wasm");
    let mut cmd = Command::new(&tool.program);
    match lang {
        Lang::Python => {
            cmd.arg("-d").arg(&wit).args(["-w", "plugin-http", "componentize", "-p"]);
            cmd.arg(sdk.parent().unwrap()).arg("-p").arg(dir).arg("app").arg("-o").arg(&staged);
        }
        Lang::Js => {
            // componentize-js resolves imports beside the module it builds.
            for file in [&source, &sdk] {
                std::fs::copy(file, stage.path().join(file.file_name().unwrap()))
                    .map_err(|e| format!("cannot stage {}: {e}", file.display()))?;
            }
            cmd.arg("app.js").arg("--wit").arg(&wit).args(["-n", "plugin-http", "-d"]);
            cmd.args(disabled.split_whitespace()).arg("-o");
            cmd.arg(&staged);
        }
    }
    let output = cmd.current_dir(stage.path()).output().map_err(|e| format!("cannot run the build: {e}"))?;
    if !output.status.success() || !staged.is_file() {
        return Err(format!(
            "{:?} failed ({}):\n{}{}",
            cmd,
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    std::fs::rename(&staged, &out).map_err(|e| format!("cannot move the build to {}: {e}", out.display()))?;
    Ok(out)
}
