//! `leash jobs show` as a person reads it: the status and the error first,
//! every line inside the terminal's width, sizes and times in human units.

use crate::support::server::leash_bin;

#[test]
fn jobs_show_leads_with_status_and_error_and_fits_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("local.db");
    let local = |args: &[&str]| leash_bin().args(args).arg("--db").arg(&db).env("COLUMNS", "72").output().unwrap();
    let panic = leash_tests::plugin_path("panic");
    let done = local(&["submit", panic.to_str().unwrap(), "--work", "--wait", "30s"]);
    let said = String::from_utf8_lossy(&done.stderr);
    let id = said.split("leash: job ").nth(1).and_then(|rest| rest.split_whitespace().next()).unwrap_or_else(|| {
        panic!("no job id: {said}");
    });
    let shown = local(&["jobs", "show", id]);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let page = String::from_utf8_lossy(&shown.stdout);
    let lines: Vec<&str> = page.lines().collect();
    assert_eq!(lines[0], format!("job       {id}"), "{page}");
    assert_eq!(lines[1], "status    failed (trap) · attempts 1/1", "{page}");
    assert!(lines[2].starts_with("error     Trap: wasm trap: wasm `unreachable` instruction executed"), "{page}");
    // The panic message is wrapped under the error, not cut.
    let error: String =
        lines[2..].iter().take_while(|l| !l.starts_with("plugin")).map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    assert!(error.ends_with("the panic plugin always panics)"), "{page}");
    for needle in [
        "limits    timeout 1 h · memory 64 MiB · output 1 MiB · fuel unlimited",
        "backtrace   0: panic.wasm!",
        " RUN  STARTED",
    ] {
        assert!(lines.iter().any(|l| l.starts_with(needle)), "{needle}: {page}");
    }
    assert!(page.contains("used      fuel ") && page.contains(" · peak memory "), "{page}");
    for line in &lines {
        assert!(line.chars().count() <= 72, "wider than the terminal ({}): {line:?}", line.chars().count());
    }
}
