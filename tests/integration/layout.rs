//! Rules about the source tree itself, read from the files.

use std::path::{Path, PathBuf};

fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.iter().any(|f| f.ends_with("runtime/mod.rs")), "walked {files:?}");
    files
}

/// Every file says what it uses: no `use …::*` outside its tests (a
/// `#[cfg(test)]` module, last in the file, may take its parent's names).
#[test]
fn no_source_file_imports_by_glob_outside_its_tests() {
    let mut globs = Vec::new();
    for file in sources() {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("use ") {
            let before = &rest[..at];
            let starts_statement = before.is_empty() || before.ends_with(['\n', ' ', '\t', '(', ')']);
            let statement = &rest[at..rest[at..].find(';').map_or(rest.len(), |end| at + end)];
            if starts_statement && statement.contains('*') && !before.trim_end().ends_with("//") {
                let line = code[..code.len() - rest.len() + at].lines().count() + 1;
                globs.push(format!("{}:{line}: {statement};", file.display()));
            }
            rest = &rest[at + 4..];
        }
    }
    assert!(globs.is_empty(), "glob imports outside tests; name what is used instead:\n{}", globs.join("\n"));
}

/// A file's module path: `src/sandbox/http/mod.rs` is `sandbox::http`.
fn module_of(file: &Path) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let relative = file.strip_prefix(&src).unwrap().with_extension("");
    let mut path: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|last| last == "mod" || last == "lib") {
        path.pop();
    }
    path
}

/// The code of a file outside its tests, without comments.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The paths (`crate::a::b`, `super::c`) a file names, resolved to modules.
fn uses_of(module: &[String], code: &str, modules: &std::collections::BTreeSet<Vec<String>>) -> Vec<Vec<String>> {
    let mut used = Vec::new();
    for (at, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut path: Vec<String> = if code[at..].starts_with("crate::") { Vec::new() } else { module.to_vec() };
        let mut rest = code[at..].strip_prefix("crate::").unwrap_or(&code[at..]);
        while let Some(after) = rest.strip_prefix("super::") {
            path.pop();
            rest = after;
        }
        for named in paths_in(rest) {
            let mut path = path.clone();
            path.extend(named.split("::").filter(|s| !s.is_empty()).map(str::to_owned));
            while !path.is_empty() && !modules.contains(&path) {
                path.pop();
            }
            used.push(path);
        }
    }
    used
}

/// The paths at the start of `text`: `a::b` of `a::b(…)`, and `a::b::c`
/// and `a::d` of `a::{b::c, d}`.
fn paths_in(text: &str) -> Vec<String> {
    let named: String = text.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
    let Some(group) = text[named.len()..].strip_prefix('{') else {
        return vec![named];
    };
    let (mut depth, mut items, mut item) = (0, Vec::new(), String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    items.iter().flat_map(|item| paths_in(item.trim())).map(|inner| format!("{named}{inner}")).collect()
}

/// No two sibling modules import each other, directly or around a longer
/// circle: each folder's modules form layers. (A module and its own parent
/// or children may name each other: a parent re-exports, a child reads its
/// parent's types.)
#[test]
fn no_modules_import_each_other_in_a_circle() {
    use std::collections::{BTreeMap, BTreeSet};
    let files: Vec<PathBuf> = sources().into_iter().filter(|f| !f.ends_with("main.rs")).collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    // Edges between siblings: `a::b::x` using `a::c::y` is `a::b` → `a::c`.
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let from = module_of(file);
        let text = std::fs::read_to_string(file).unwrap();
        for to in uses_of(&from, &code_of(&text), &modules) {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue;
            }
            edges.entry(from[..=common].to_vec()).or_default().insert(to[..=common].to_vec());
        }
    }
    // Any circle: a module that reaches itself, named by its members.
    let mut circles: BTreeSet<Vec<String>> = BTreeSet::new();
    for start in edges.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(Vec<String>, Vec<Vec<String>>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    let mut members: Vec<String> = trail.iter().map(|m| m.join("::")).collect();
                    members.sort();
                    circles.insert(members);
                } else if seen.insert(next.clone()) {
                    let mut longer = trail.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    let named: Vec<String> = circles.iter().map(|c| c.join(" ↔ ")).collect();
    assert!(named.is_empty(), "modules that import each other in a circle (layer them):\n{}", named.join("\n"));
}

/// The library's floors, lowest first, as `lib.rs` documents them: a
/// module may use only modules on floors below its own.
const FLOORS: &[&[&str]] = &[
    &["clock"],
    &["job", "config", "access"],
    &["metrics", "store", "sandbox"],
    &["worker"],
    &["runtime"],
    &["api"],
    &["client"],
    &["cli"],
];

/// Nothing imports upward or sideways: each top-level module uses only
/// modules on floors below its own.
#[test]
fn no_module_uses_one_on_its_own_floor_or_above() {
    use std::collections::BTreeSet;
    let floor = |module: &str| FLOORS.iter().position(|floor| floor.contains(&module));
    let files: Vec<PathBuf> = sources().into_iter().filter(|f| !f.ends_with("main.rs")).collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    let mut upward = BTreeSet::new();
    for file in &files {
        let from = module_of(file);
        let Some(top) = from.first() else { continue };
        let Some(own) = floor(top) else { panic!("{top} has no floor: add it to FLOORS and lib.rs") };
        let text = std::fs::read_to_string(file).unwrap();
        for to in uses_of(&from, &code_of(&text), &modules) {
            match to.first() {
                Some(used) if used != top && floor(used).is_none_or(|theirs| theirs >= own) => {
                    upward.insert(format!("{top} (floor {own}) uses {used} (floor {:?})", floor(used)));
                }
                _ => {}
            }
        }
    }
    let upward: Vec<String> = upward.into_iter().collect();
    assert!(upward.is_empty(), "{}", upward.join("\n"));
}

/// The longest a source file in `host/src` may be.
const MOST_LINES: usize = 600;

/// Every source file can be read in one sitting: at most 600 lines.
#[test]
fn no_source_file_is_over_six_hundred_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut over = Vec::new();
    for file in sources() {
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        if lines > MOST_LINES {
            let name = file.strip_prefix(&src).unwrap().display();
            over.push(format!("{name}: {lines} lines (at most {MOST_LINES}: split it by what its parts do)"));
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
}

/// A release build is one a user would ship: its debug info is stripped
/// (README.md says its size), while the bench profile, which profilers
/// read, keeps its line tables.
#[test]
fn the_release_profile_strips_debug_info_and_the_bench_profile_keeps_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml")).unwrap().parse().unwrap();
    let profile =
        |name: &str, key: &str| manifest["profile"][name].get(key).and_then(|v| v.as_str()).map(str::to_owned);
    assert_eq!(profile("release", "strip").as_deref(), Some("debuginfo"));
    assert_eq!(profile("bench", "strip").as_deref(), Some("none"));
    assert_eq!(profile("bench", "debug").as_deref(), Some("line-tables-only"));
}
