//! `leash new`: a plugin project to start from, in Rust, Python or
//! JavaScript. The templates (`host/templates/`) and the helpers they
//! carry (the Python and JavaScript SDK modules, the WIT) are compiled
//! into the binary, so a scaffold needs nothing but the language's own
//! toolchain.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::cli::{CliError, ExitStatus};

/// The contract a Python or JavaScript scaffold builds against: leash's
/// package (`plugin`, and `plugin-http` with outbound HTTP) and the WASI
/// packages `wasi:http` needs, as the host implements them.
const WIT: &[TemplateFile] = &[
    ("wit/plugin.wit", include_str!("../../../../wit/plugin.wit")),
    ("wit/http.wit", include_str!("../../../../wit/http.wit")),
    ("wit/deps/cli.wit", include_str!("../../../../wit/deps/cli.wit")),
    ("wit/deps/clocks.wit", include_str!("../../../../wit/deps/clocks.wit")),
    ("wit/deps/filesystem.wit", include_str!("../../../../wit/deps/filesystem.wit")),
    ("wit/deps/http.wit", include_str!("../../../../wit/deps/http.wit")),
    ("wit/deps/io.wit", include_str!("../../../../wit/deps/io.wit")),
    ("wit/deps/random.wit", include_str!("../../../../wit/deps/random.wit")),
    ("wit/deps/sockets.wit", include_str!("../../../../wit/deps/sockets.wit")),
];

/// A plugin language `leash new` scaffolds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(in crate::cli) enum Lang {
    /// `leash-sdk`, built with cargo for wasm32-wasip2.
    Rust,
    /// componentize-py 0.25.
    Python,
    /// componentize-js 0.23 (via npm).
    Js,
}

/// A language's template: the files every scaffold has, then the ones the
/// plain (greeter), the `--with http` (fetcher) and the `--with plan`
/// (planner) plugins differ in.
struct Template {
    common: &'static [TemplateFile],
    greeter: &'static [TemplateFile],
    fetcher: &'static [TemplateFile],
    planner: &'static [TemplateFile],
}

/// One file of a template: where it goes and its text, with `{{name}}`,
/// `{{sdk}}`, `{{build}}` and `{{test}}` still to fill in.
type TemplateFile = (&'static str, &'static str);

const RUST: Template = Template {
    common: &[
        ("Cargo.toml", include_str!("../../../templates/rust/Cargo.toml")),
        ("tests/built/mod.rs", include_str!("../../../templates/rust/tests/built/mod.rs")),
        (".gitignore", include_str!("../../../templates/rust/gitignore")),
    ],
    greeter: &[
        ("src/lib.rs", include_str!("../../../templates/rust/src/lib.rs")),
        ("tests/plugin.rs", include_str!("../../../templates/rust/tests/plugin.rs")),
        ("README.md", include_str!("../../../templates/rust/README.md")),
    ],
    fetcher: &[
        ("src/lib.rs", include_str!("../../../templates/rust/http/src/lib.rs")),
        ("tests/plugin.rs", include_str!("../../../templates/rust/http/tests/plugin.rs")),
        ("README.md", include_str!("../../../templates/rust/http/README.md")),
    ],
    planner: &[
        ("src/lib.rs", include_str!("../../../templates/rust/plan/src/lib.rs")),
        ("tests/plugin.rs", include_str!("../../../templates/rust/plan/tests/plugin.rs")),
        ("README.md", include_str!("../../../templates/rust/plan/README.md")),
    ],
};

const PYTHON: Template = Template {
    common: &[
        ("leash.py", include_str!("../../../../guest-sdk/python/leash.py")),
        ("built.py", include_str!("../../../templates/python/built.py")),
        (".gitignore", include_str!("../../../templates/python/gitignore")),
    ],
    greeter: &[
        ("app.py", include_str!("../../../templates/python/app.py")),
        ("test_plugin.py", include_str!("../../../templates/python/test_plugin.py")),
        ("README.md", include_str!("../../../templates/python/README.md")),
    ],
    fetcher: &[
        ("app.py", include_str!("../../../templates/python/http/app.py")),
        ("test_plugin.py", include_str!("../../../templates/python/http/test_plugin.py")),
        ("README.md", include_str!("../../../templates/python/http/README.md")),
    ],
    planner: &[
        ("app.py", include_str!("../../../templates/python/plan/app.py")),
        ("test_plugin.py", include_str!("../../../templates/python/plan/test_plugin.py")),
        ("README.md", include_str!("../../../templates/python/plan/README.md")),
    ],
};

const JS: Template = Template {
    common: &[
        ("leash.js", include_str!("../../../../guest-sdk/js/leash.js")),
        ("package.json", include_str!("../../../templates/js/package.json")),
        ("built.mjs", include_str!("../../../templates/js/built.mjs")),
        (".gitignore", include_str!("../../../templates/js/gitignore")),
    ],
    greeter: &[
        ("app.js", include_str!("../../../templates/js/app.js")),
        ("test.mjs", include_str!("../../../templates/js/test.mjs")),
        ("README.md", include_str!("../../../templates/js/README.md")),
    ],
    fetcher: &[
        ("app.js", include_str!("../../../templates/js/http/app.js")),
        ("test.mjs", include_str!("../../../templates/js/http/test.mjs")),
        ("README.md", include_str!("../../../templates/js/http/README.md")),
    ],
    planner: &[
        ("app.js", include_str!("../../../templates/js/plan/app.js")),
        ("test.mjs", include_str!("../../../templates/js/plan/test.mjs")),
        ("README.md", include_str!("../../../templates/js/plan/README.md")),
    ],
};

impl Lang {
    fn template(self) -> &'static Template {
        match self {
            Lang::Rust => &RUST,
            Lang::Python => &PYTHON,
            Lang::Js => &JS,
        }
    }

    /// The files a scaffold gets: Rust's WIT comes with `leash-sdk`.
    fn files(self, with: Option<With>) -> Vec<TemplateFile> {
        let template = self.template();
        let own = match with {
            None => template.greeter,
            Some(With::Http) => template.fetcher,
            Some(With::Plan) => template.planner,
        };
        let wit: &[TemplateFile] = if self == Lang::Rust { &[] } else { WIT };
        [template.common, own, wit].concat()
    }
}

/// What a scaffold starts from beyond the greeter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(in crate::cli) enum With {
    /// A plugin that fetches JSON from `{"url": "..."}` with the SDK's
    /// HTTP helper, retrying a 5xx.
    Http,
    /// A plan: its execute phase reads a record store and proposes the
    /// writes that bring it to the records wanted; its apply phase sends
    /// the approved ones.
    Plan,
}

/// Where `leash-sdk` was when this binary was built: a Rust scaffold's
/// default path dependency.
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk/rust");

#[derive(Debug, Args)]
pub(in crate::cli) struct NewArgs {
    /// The plugin's name, and the folder created for it: lowercase letters,
    /// digits and `-`, starting with a letter.
    name: String,
    /// The language to write it in.
    #[arg(long, value_enum, default_value = "rust")]
    lang: Lang,
    /// Start from a plugin that does more than greet: `http` fetches JSON
    /// from a URL (granted with `--allow-host`) and retries a 5xx; `plan`
    /// is a plan whose execute phase proposes writes and whose apply phase
    /// sends the approved ones (docs/plans.md).
    #[arg(long, visible_alias = "template", value_enum, value_name = "WHAT")]
    with: Option<With>,
    /// Create the folder here instead of in the current directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Rust only: the `leash-sdk` crate to depend on (a leash checkout's
    /// `guest-sdk/rust`). Default: the one this leash was built from.
    #[arg(long, value_name = "PATH")]
    sdk: Option<PathBuf>,
    /// Print what was created as one JSON object.
    #[arg(long)]
    json: bool,
}

/// What `leash new --json` prints.
#[derive(Debug, Serialize)]
struct Created {
    name: String,
    lang: Lang,
    /// What it starts from beyond the greeter (`http`), if anything.
    with: Option<With>,
    dir: PathBuf,
    files: Vec<&'static str>,
    /// Run in `dir`: builds `<name>.wasm` there.
    build: String,
    /// Run in `dir` after the build.
    run: String,
    /// Run in `dir` after the build: the scaffold's own test.
    test: String,
}

pub(in crate::cli) fn new_plugin(args: NewArgs) -> Result<ExitStatus, CliError> {
    check_name(&args.name).map_err(CliError::usage)?;
    let dir = args.dir.clone().unwrap_or_default().join(&args.name);
    let files = args.lang.files(args.with);
    let (build, test) = match args.lang {
        // Where cargo puts it: `target/`, or $CARGO_TARGET_DIR when set.
        Lang::Rust => (
            format!(
                "cargo build --release --target wasm32-wasip2 && \
                 cp \"${{CARGO_TARGET_DIR:-target}}/wasm32-wasip2/release/{}.wasm\" {}.wasm",
                crate_name(&args.name),
                args.name
            ),
            "cargo test".to_owned(),
        ),
        Lang::Python => (
            format!("componentize-py -d wit -w plugin-http componentize app -o {}.wasm", args.name),
            "python3 -m unittest".to_owned(),
        ),
        Lang::Js => ("npm install && npm run build".to_owned(), "npm test".to_owned()),
    };
    let sdk = match args.lang {
        Lang::Rust => sdk_path(args.sdk.as_deref())?,
        _ => String::new(),
    };
    refuse_non_empty(&dir)?;
    let fill = |text: &str| {
        text.replace("{{name}}", &args.name)
            .replace("{{sdk}}", &sdk)
            .replace("{{build}}", &build)
            .replace("{{test}}", &test)
    };
    for (path, text) in &files {
        let target = dir.join(path);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(target.parent().expect("a template file is inside the project"))?;
            std::fs::write(&target, fill(text))
        };
        write().map_err(|e| CliError::internal(format!("cannot write {}: {e}", target.display())))?;
    }
    let run = match args.with {
        None => format!("leash run {}.wasm", args.name),
        Some(With::Http) => format!(
            "echo '{{\"url\": \"https://httpbin.org/json\"}}' | leash run --allow-host 'GET https://httpbin.org' \
             --input - {}.wasm",
            args.name
        ),
        Some(With::Plan) => format!(
            "echo '{{\"store\": \"http://127.0.0.1:8080/records\", \"desired\": {{\"a\": \"1\"}}}}' | leash run \
             --plan --phase execute --json --allow-host 'GET,PUT,DELETE http://127.0.0.1:8080' --input - {}.wasm",
            args.name
        ),
    };
    if args.json {
        let created = Created {
            name: args.name.clone(),
            lang: args.lang,
            with: args.with,
            dir: dir.clone(),
            files: files.iter().map(|(path, _)| *path).collect(),
            build,
            run,
            test,
        };
        println!("{}", serde_json::to_string(&created).map_err(|e| CliError::internal(e.to_string()))?);
    } else {
        say!("leash: created {} ({:?} plugin). Next:", dir.display(), args.lang);
        say!("  cd {}", dir.display());
        say!("  {build}");
        say!("  {run}");
        say!("  {test}");
    }
    Ok(ExitStatus::Success)
}

/// A name that is a valid crate, npm package and file name everywhere.
fn check_name(name: &str) -> Result<(), String> {
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "invalid plugin name {name:?}: use 1-64 lowercase letters, digits and `-`, starting with a letter and \
             not ending with `-`"
        ))
    }
}

fn crate_name(name: &str) -> String {
    name.replace('-', "_")
}

fn sdk_path(given: Option<&Path>) -> Result<String, CliError> {
    let path = given.map_or_else(|| PathBuf::from(BUILT_SDK), Path::to_path_buf);
    let found = path.join("Cargo.toml").is_file().then(|| path.canonicalize().ok()).flatten();
    let Some(found) = found else {
        return Err(CliError::usage(format!(
            "cannot find leash-sdk at {}: pass --sdk PATH, the guest-sdk/rust folder of a leash checkout",
            path.display()
        )));
    };
    // Cargo reads the path inside a TOML string.
    Ok(found.display().to_string().replace('\\', "\\\\").replace('"', "\\\""))
}

fn refuse_non_empty(dir: &Path) -> Result<(), CliError> {
    match std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()) {
        Ok(false) => Err(CliError::usage(format!(
            "{} already exists and is not empty: leash new writes only into a new or empty folder",
            dir.display()
        ))),
        Ok(true) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            Err(CliError::usage(format!("{} already exists and is not a folder", dir.display())))
        }
        Err(e) => Err(CliError::usage(format!("cannot read {}: {e}", dir.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_suit_every_language() {
        for good in ["hello", "my-plugin", "p2"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Hello", "2fast", "a_b", "a b", "-a", "a-", "../x", "a/b"] {
            assert!(check_name(bad).unwrap_err().contains("invalid plugin name"), "{bad}");
        }
    }

    #[test]
    fn every_placeholder_in_a_template_is_one_that_is_filled() {
        let every = [Lang::Rust, Lang::Python, Lang::Js]
            .into_iter()
            .flat_map(|lang| [lang.files(None), lang.files(Some(With::Http)), lang.files(Some(With::Plan))])
            .flatten();
        for (path, text) in every {
            let mut rest = text;
            while let Some(at) = rest.find("{{") {
                let end = rest[at..].find("}}").map(|e| at + e + 2).unwrap_or(rest.len());
                let key = &rest[at..end];
                assert!(["{{name}}", "{{sdk}}", "{{build}}", "{{test}}"].contains(&key), "{path}: {key}");
                rest = &rest[end..];
            }
        }
    }
}
