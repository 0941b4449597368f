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
