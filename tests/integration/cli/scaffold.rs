//! `leash new` as an author uses it: scaffold a plugin in each language in
//! a temp folder, build it with the command the scaffold prints, run it
//! with `leash run`, and run the scaffold's own test. Python and
//! JavaScript need their toolchains (see `leash_tests::polyglot`); without
//! them those tests say they were skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use leash_tests::polyglot::{self, Lang};

use crate::support::Upstream;
use crate::support::server::Server;

fn leash() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leash"))
}

/// A shell in `dir` whose `leash` is the binary under test. Cargo builds
/// share one target folder (the printed build command copies from
/// `$CARGO_TARGET_DIR` when it is set), so each scaffold compiles only its
/// own crate; every crate built here has a name of its own.
fn shell(dir: &Path, line: &str) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_leash")).parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    Command::new("sh")
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        .env("LEASH", env!("CARGO_BIN_EXE_leash"))
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffolds"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {line}: {e}"))
}

fn check(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `leash new NAME --lang LANG [--with WITH]` in `parent`, built with the
/// command it prints: what it printed, and the folder.
fn scaffold_and_build(parent: &Path, name: &str, lang: &str, with: Option<&str>) -> (serde_json::Value, PathBuf) {
    let (created, dir) = scaffold(parent, name, lang, with);
    build(&created, &dir);
    (created, dir)
}

/// Build a scaffold with the command `leash new` printed.
fn build(created: &serde_json::Value, dir: &Path) {
    let name = created["name"].as_str().unwrap();
    check(&shell(dir, created["build"].as_str().unwrap()), "the printed build command");
    assert!(dir.join(format!("{name}.wasm")).is_file(), "the build made no {name}.wasm");
}

/// `leash new NAME --lang LANG [--with WITH]` in `parent`: what it
/// printed, and the folder, every file it named written.
fn scaffold(parent: &Path, name: &str, lang: &str, with: Option<&str>) -> (serde_json::Value, PathBuf) {
    let mut new = leash();
    new.args(["new", name, "--lang", lang, "--json", "--dir"]).arg(parent);
    if let Some(with) = with {
        new.args(["--with", with]);
    }
    let output = new.output().unwrap();
    check(&output, "leash new");
    let created: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let dir = PathBuf::from(created["dir"].as_str().unwrap());
    assert_eq!(dir, parent.join(name));
    for file in created["files"].as_array().unwrap() {
        assert!(dir.join(file.as_str().unwrap()).is_file(), "{file} was not written");
    }
    (created, dir)
}

/// The scaffold's own test fails once a source is newer than the build
/// (an edit without a rebuild), saying to rebuild.
fn its_test_refuses_a_stale_build(dir: &Path, created: &serde_json::Value, source: &str) {
    let path = dir.join(source);
    let text = std::fs::read(&path).unwrap();
    // A write a second later than the build: mtimes may be coarse.
    let later =
        std::fs::metadata(dir.join(format!("{}.wasm", created["name"].as_str().unwrap()))).unwrap().modified().unwrap()
            + std::time::Duration::from_secs(2);
    std::fs::write(&path, &text).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
    let stale = shell(dir, created["test"].as_str().unwrap());
    assert!(!stale.status.success(), "the test passed on a stale build");
    let said = format!("{}{}", String::from_utf8_lossy(&stale.stdout), String::from_utf8_lossy(&stale.stderr));
    assert!(said.contains("is older than") && said.contains("rebuild it with"), "{said}");
}

/// `leash new`, the printed build, `leash run` and the scaffold's test.
fn scaffold_builds_runs_and_passes_its_test(lang: &str) {
    let parent = tempfile::tempdir().unwrap();
    let name = format!("greeter-{lang}");
    let (created, dir) = scaffold_and_build(parent.path(), &name, lang, None);

    let ran = shell(&dir, created["run"].as_str().unwrap());
    check(&ran, "the printed run command");
    let output: serde_json::Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(output["greeting"], "Hello, world!");
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(stderr.contains("[info] greeting world (attempt 1)"), "{stderr}");

    check(&shell(&dir, created["test"].as_str().unwrap()), "the scaffold's own test");
    let source = match lang {
        "rust" => "src/lib.rs",
        "python" => "app.py",
        _ => "app.js",
    };
    its_test_refuses_a_stale_build(&dir, &created, source);

    // `leash dev` finds the language's build on its own (for Rust, the
    // target folder through cargo metadata), rebuilds and runs.
    let dev = leash().args(["dev", "--once"]).arg(&dir).output().unwrap();
    check(&dev, "leash dev --once");
    let said = String::from_utf8_lossy(&dev.stdout);
    assert!(said.starts_with("#1 built in ") && said.contains(" · succeeded in "), "{said}");
    assert!(said.contains(r#""greeting":"Hello, world!""#), "{said}");

    // A second `leash new` into the same folder refuses and writes nothing.
    let before = std::fs::read(dir.join("README.md")).unwrap();
    let again = leash().args(["new", &name, "--lang", lang, "--dir"]).arg(parent.path()).output().unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists and is not empty"));
    assert_eq!(std::fs::read(dir.join("README.md")).unwrap(), before);
}

/// `leash new --with http`: built with the printed command, it fetches
/// JSON from a loopback upstream through `leash run` with a grant, passes
/// its own test (which starts an upstream of its own), and, added as a
/// plugin with the grant, runs as a durable job that meets a 503, retries
/// once and succeeds, both attempts on record in `jobs show --json`.
async fn http_scaffold_fetches_retries_and_passes_its_test(lang: &str) {
    let upstream = Upstream::start().await;
    let lang = lang.to_owned();
    let rule = format!("GET {}", upstream.url(""));
    let (json_url, flaky_url) = (upstream.url("/json"), upstream.url("/flaky"));
    let seen = tokio::task::spawn_blocking(move || {
        let parent = tempfile::tempdir().unwrap();
        let name = format!("fetcher-{lang}");
        let (created, dir) = scaffold_and_build(parent.path(), &name, &lang, Some("http"));
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains("leash run --allow-host 'GET http://127.0.0.1:8080' --input input.json"), "{readme}");
        std::fs::write(dir.join("input.json"), serde_json::json!({ "url": json_url }).to_string()).unwrap();
        let ran = shell(&dir, &format!("leash run --allow-host '{rule}' --input input.json {name}.wasm"));
        check(&ran, "leash run with the grant");
        let output: serde_json::Value = serde_json::from_slice(&ran.stdout).unwrap();
        assert_eq!(output, serde_json::json!({ "status": 200, "data": {"hello": "world"} }));

        check(&shell(&dir, created["test"].as_str().unwrap()), "the scaffold's own test");

        // Durable: a 503, then the answer.
        let server = Server::start(&parent.path().join("s.db"), &[]);
        let with_server = |line: &str| {
            shell(&dir, &format!("{line} --server {} --token-file {}", server.url, server.token_file.display()))
        };
        check(&with_server(&format!("leash plugins add {name}.wasm --allow-host '{rule}'")), "plugins add");
        std::fs::write(dir.join("flaky.json"), serde_json::json!({ "url": flaky_url }).to_string()).unwrap();
        let submitted = with_server(&format!(
            "leash submit {name} --input flaky.json --max-attempts 2 --retry-backoff 50ms --wait 2m --json"
        ));
        check(&submitted, "submit --wait");
        let answer: serde_json::Value = serde_json::from_slice(&submitted.stdout).unwrap();
        assert_eq!(answer["job"]["status"], "succeeded", "{answer}");
        assert_eq!(answer["output"]["data"], serde_json::json!({"hello": "world"}));
        let id = answer["job"]["id"].as_str().unwrap().to_owned();
        let shown = with_server(&format!("leash jobs show {id} --json"));
        check(&shown, "jobs show");
        serde_json::from_slice::<serde_json::Value>(&shown.stdout).unwrap()
    })
    .await
    .unwrap();
    assert_eq!((seen["attempt"].as_u64(), seen["retries"].as_u64()), (Some(2), Some(1)), "{seen}");
    let attempts = seen["attempts"].as_array().unwrap_or_else(|| panic!("no attempts: {seen}"));
    let outcomes: Vec<&str> = attempts.iter().map(|a| a["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["retried", "succeeded"], "{seen}");
    let first = attempts[0]["error"].as_str().unwrap_or_default();
    assert!(first.starts_with("guest_error: Retryable: ") && first.ends_with("/flaky answered 503"), "{seen}");
    let flaky: Vec<String> = upstream.received().into_iter().filter(|e| e.contains("/flaky")).collect();
    assert_eq!(flaky, ["GET /flaky", "GET /flaky"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn leash_new_with_http_in_rust_fetches_retries_and_passes_its_test() {
    http_scaffold_fetches_retries_and_passes_its_test("rust").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn leash_new_with_http_in_python_fetches_retries_and_passes_its_test() {
    if let Err(why) = polyglot::tool(Lang::Python) {
        assert!(!polyglot::required(), "the Python scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    http_scaffold_fetches_retries_and_passes_its_test("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn leash_new_with_http_in_js_fetches_retries_and_passes_its_test() {
    if let Err(why) = Command::new("npm").arg("--version").output().map_err(|e| format!("npm is not installed: {e}")) {
        assert!(!polyglot::required(), "the JavaScript scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    http_scaffold_fetches_retries_and_passes_its_test("js").await;
}

/// `leash new --template plan`: built with the printed command, it passes
/// its own test (both phases through `leash run`: execute proposes, apply
/// sends exactly the proposals), and, added with a grant to a record store
/// and submitted as a plan, shows its proposed writes with the digest to
/// approve them by; approved with that digest, it applies exactly them.
async fn plan_scaffold_proposes_applies_and_passes_its_test(lang: &str) {
    let records = crate::api::plans::Records::start(&[("a", "1"), ("c", "3")]).await;
    let (lang, url, addr) = (lang.to_owned(), records.url(), records.addr);
    let store = url.clone();
    let parent = tempfile::tempdir().unwrap();
    let (server, dir, name) = tokio::task::spawn_blocking({
        let parent = parent.path().to_owned();
        move || {
            let name = format!("planner-{lang}");
            let (created, dir) = scaffold_and_build(&parent, &name, &lang, Some("plan"));
            check(&shell(&dir, created["test"].as_str().unwrap()), "the scaffold's own test");
            // `leash dev --plan` runs execute as a plan's: it proposes.
            let want = serde_json::json!({ "store": url, "desired": { "a": "1", "b": "2" } });
            std::fs::write(dir.join("in.json"), want.to_string()).unwrap();
            let dev = shell(
                &dir,
                &format!(
                    "leash dev --once --plan --input in.json --allow-host 'GET,PUT,DELETE http://{addr}' \
                     --allow-private 127.0.0.0/8"
                ),
            );
            check(&dev, "leash dev --once --plan");
            let said = String::from_utf8_lossy(&dev.stdout);
            assert!(said.contains(" · succeeded in ") && said.contains(" · 2 proposed · "), "{said}");
            let server = Server::start(&parent.join("s.db"), &[]);
            let line = format!(
                "leash plugins add {name}.wasm --allow-host 'GET,PUT,DELETE http://{addr}' --allow-private 127.0.0.0/8 \
                 --server {} --token-file {}",
                server.url,
                server.token_file.display()
            );
            check(&shell(&dir, &line), "plugins add");
            (server, dir, name)
        }
    })
    .await
    .unwrap();
    let input = dir.join("in.json");
    let submitted =
        crate::cli::ops::leash(&server, &["plan", "submit", &name, "--input", input.to_str().unwrap(), "--wait", "1m"]);
    let shown = String::from_utf8_lossy(&submitted.stdout).into_owned();
    assert_eq!(submitted.status.code(), Some(0), "{shown}{}", String::from_utf8_lossy(&submitted.stderr));
    assert!(shown.contains("proposed effects: 2"), "{shown}");
    assert!(shown.contains(&format!("#1 PUT {store}/b")) && shown.contains("    + 2"), "{shown}");
    assert!(shown.contains(&format!("#2 DELETE {store}/c")), "{shown}");
    let id = shown.split_whitespace().nth(1).unwrap().to_owned();
    let digest = shown.split("--digest ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap().to_owned();
    let alice = server.principal("alice", &["approve"]).await;
    let approve = ["plan", "approve", &id, "--phase", "apply", "--digest", &digest];
    let approved = crate::cli::ops::leash_as(&server, &alice, &approve);
    assert_eq!(approved.status.code(), Some(0), "{}", String::from_utf8_lossy(&approved.stderr));
    crate::api::plans::poll_plan(&server, &id, |s| s == "applied").await;
    assert_eq!(records.changes(), ["PUT b=2", "DELETE c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn leash_new_plan_in_rust_proposes_applies_and_passes_its_test() {
    plan_scaffold_proposes_applies_and_passes_its_test("rust").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn leash_new_plan_in_python_proposes_applies_and_passes_its_test() {
    if let Err(why) = polyglot::tool(Lang::Python) {
        assert!(!polyglot::required(), "the Python scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    plan_scaffold_proposes_applies_and_passes_its_test("python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn leash_new_plan_in_js_proposes_applies_and_passes_its_test() {
    if let Err(why) = Command::new("npm").arg("--version").output().map_err(|e| format!("npm is not installed: {e}")) {
        assert!(!polyglot::required(), "the JavaScript scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    plan_scaffold_proposes_applies_and_passes_its_test("js").await;
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn leash_new_rust_builds_runs_and_passes_its_test() {
    scaffold_builds_runs_and_passes_its_test("rust");
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn leash_new_python_builds_runs_and_passes_its_test() {
    if let Err(why) = polyglot::tool(Lang::Python) {
        assert!(!polyglot::required(), "the Python scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    scaffold_builds_runs_and_passes_its_test("python");
}

#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn leash_new_js_builds_runs_and_passes_its_test() {
    if let Err(why) = Command::new("npm").arg("--version").output().map_err(|e| format!("npm is not installed: {e}")) {
        assert!(!polyglot::required(), "the JavaScript scaffold test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    scaffold_builds_runs_and_passes_its_test("js");
}

#[test]
fn leash_new_refuses_bad_names_and_files_in_the_way() {
    let parent = tempfile::tempdir().unwrap();
    let bad = leash().args(["new", "Bad_Name", "--dir"]).arg(parent.path()).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid plugin name"));
    std::fs::write(parent.path().join("taken"), b"a file").unwrap();
    let taken = leash().args(["new", "taken", "--lang", "python", "--dir"]).arg(parent.path()).output().unwrap();
    assert_eq!(taken.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&taken.stderr).contains("not a folder"));
    assert_eq!(std::fs::read(parent.path().join("taken")).unwrap(), b"a file");
    // An empty folder is fine.
    std::fs::create_dir(parent.path().join("empty")).unwrap();
    let empty = leash().args(["new", "empty", "--lang", "js", "--dir"]).arg(parent.path()).output().unwrap();
    assert!(empty.status.success(), "{}", String::from_utf8_lossy(&empty.stderr));
    assert!(parent.path().join("empty/app.js").is_file());
}

/// The fenced blocks of one section of a Markdown file: (language, text).
fn fenced_blocks(markdown: &str, heading: &str) -> Vec<(String, String)> {
    let start = markdown.find(heading).unwrap_or_else(|| panic!("no {heading:?}"));
    let section = &markdown[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```").filter(|l| !l.is_empty()) {
            let text: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            blocks.push((lang.to_owned(), text.join("\n") + "\n"));
        }
    }
    blocks
}

/// `docs/plugin-authors.md`'s "Calling an upstream" runs as written: its
/// shell block (with the test upstream's address for the port it names),
/// then each language's program, put in a `--with http` scaffold in place
/// of the scaffold's own, built and run with a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn plugin_authors_doc_runs_as_written() {
    if let Err(why) = polyglot::tool(Lang::Python) {
        assert!(!polyglot::required(), "the docs test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    let upstream = Upstream::start().await;
    let addr = upstream.addr.to_string();
    tokio::task::spawn_blocking(move || {
        let doc = std::fs::read_to_string(polyglot::root().join("docs/plugin-authors.md")).unwrap();
        let blocks = fenced_blocks(&doc, "## Calling an upstream");
        let langs: Vec<&str> = blocks.iter().map(|(lang, _)| lang.as_str()).collect();
        assert_eq!(langs, ["sh", "rust", "python", "js"], "the section's code blocks");
        let want = serde_json::json!({ "status": 200, "data": {"hello": "world"} });

        let parent = tempfile::tempdir().unwrap();
        let script = format!("set -e\n{}", blocks[0].1.replace("127.0.0.1:8080", &addr));
        let ran = shell(parent.path(), &script);
        check(&ran, "the doc's shell block");
        // What `leash run` printed last; `leash new` and the build speak first.
        let stdout = String::from_utf8_lossy(&ran.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        assert_eq!(serde_json::from_str::<serde_json::Value>(last).unwrap_or_default(), want, "{stdout}");

        for (lang, program) in &blocks[1..] {
            let input = serde_json::json!({ "url": format!("http://{addr}/json") });
            let grant = format!("--allow-host 'GET http://{addr}'");
            assert_eq!(run_doc_program(parent.path(), lang, program, Some("http"), &input, &grant), want, "{lang}");
        }
    })
    .await
    .unwrap();
}

/// `program`, a doc's `lang` block, put in a scaffold (`--with with`) in
/// place of the scaffold's own source, built with its printed command and
/// run by `leash run FLAGS` on `input`: its output.
fn run_doc_program(
    parent: &Path,
    lang: &str,
    program: &str,
    with: Option<&str>,
    input: &serde_json::Value,
    flags: &str,
) -> serde_json::Value {
    let (scaffold_lang, source) = match lang {
        "rust" => ("rust", "src/lib.rs"),
        "python" => ("python", "app.py"),
        _ => ("js", "app.js"),
    };
    // A name no other build here has at the same time (see [`shell`]).
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("doc-{scaffold_lang}-{}-{n}", with.unwrap_or("plain"));
    let (created, dir) = scaffold(parent, &name, scaffold_lang, with);
    std::fs::write(dir.join(source), program).unwrap();
    build(&created, &dir);
    std::fs::write(dir.join("input.json"), input.to_string()).unwrap();
    let ran = shell(&dir, &format!("leash run {flags} --input input.json {name}.wasm"));
    check(&ran, &format!("the doc's {lang} program"));
    serde_json::from_slice(&ran.stdout).unwrap_or_else(|e| panic!("{lang}: not JSON ({e}): {ran:?}"))
}

/// `docs/plugin-authors.md`'s Rust, Python and JavaScript sections: each
/// section's program, built in a plain scaffold, runs as the doc says.
#[test]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
fn plugin_authors_doc_language_sections_run_as_written() {
    if let Err(why) = polyglot::tool(Lang::Python) {
        assert!(!polyglot::required(), "the docs test must not be skipped: {why}");
        return polyglot::say_skipped(&why);
    }
    let doc = std::fs::read_to_string(polyglot::root().join("docs/plugin-authors.md")).unwrap();
    let parent = tempfile::tempdir().unwrap();
    let input = serde_json::json!({ "name": "Ada" });
    let greeting = serde_json::json!({ "greeting": "Hello, Ada!" });
    // The Rust example hands its input back; the others greet.
    for (heading, lang, want) in
        [("## Rust", "rust", &input), ("## Python", "python", &greeting), ("## JavaScript", "js", &greeting)]
    {
        let blocks = fenced_blocks(&doc, &format!("{heading}\n"));
        let (block_lang, program) = blocks.first().unwrap_or_else(|| panic!("{heading} has no code block"));
        assert_eq!(block_lang, lang, "{heading}'s first block");
        assert_eq!(&run_doc_program(parent.path(), lang, program, None, &input, ""), want, "{heading}");
    }
}
