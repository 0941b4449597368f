//! "Allow & Remember" from the CLI: `leash jobs approve --remember` says
//! which rule it made, the rule approves the matching job already waiting,
//! and `leash rules list|show|revoke` show and end it.

use serde_json::Value;

use crate::cli::audit::{leash, ok};

#[test]
fn an_approval_remembered_from_the_cli_approves_its_twin_and_is_revoked_by_its_author() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let db = db.to_str().unwrap();
    ok(leash(db, None, &["principals", "add", "sam", "--role", "submit"]));
    ok(leash(db, None, &["principals", "add", "alice", "--role", "approve"]));
    let sam = ok(leash(db, None, &["tokens", "create", "sam"])).trim().to_owned();
    let alice = ok(leash(db, None, &["tokens", "create", "alice"])).trim().to_owned();
    let hello = leash_tests::plugin_path("hello");
    ok(leash(db, None, &["plugins", "add", hello.to_str().unwrap(), "--name", "hello", "--version", "1"]));
    ok(leash(db, None, &["plugins", "approval", "hello@1", "--require", "execute"]));
    let input = dir.path().join("input.json");
    std::fs::write(&input, "{\"name\":\"ada\"}").unwrap();
    let submit = ["submit", "hello@1", "--input", input.to_str().unwrap()];
    let first = ok(leash(db, Some(&sam), &submit)).trim().to_owned();
    let twin = ok(leash(db, Some(&sam), &submit)).trim().to_owned();

    let said = ok(leash(db, Some(&alice), &["jobs", "approve", &first, "--remember", "2h"]));
    let rule = said
        .lines()
        .find_map(|l| l.strip_prefix("remembered as rule "))
        .unwrap_or_else(|| panic!("it names the rule: {said}"))
        .to_owned();
    let shown: Value = serde_json::from_str(&ok(leash(db, None, &["jobs", "show", &twin, "--json"]))).unwrap();
    let approval = &shown["approval"]["decision"];
    assert_eq!((approval["by"].as_str(), approval["rule"].as_str()), (Some("alice"), Some(rule.as_str())), "{shown}");

    let listed: Value = serde_json::from_str(&ok(leash(db, Some(&alice), &["rules", "list", "--json"]))).unwrap();
    assert_eq!(listed["rules"][0]["id"], rule.as_str(), "{listed}");
    let show = ok(leash(db, Some(&alice), &["rules", "show", &rule]));
    assert!(show.contains("state      active") && show.contains("uses       1"), "{show}");
    assert!(show.contains("submitter  sam"), "{show}");

    let refused = leash(db, Some(&sam), &["rules", "list"]);
    assert_eq!(refused.status.code(), Some(7), "sam may not read rules: {}", String::from_utf8_lossy(&refused.stderr));
    let said = ok(leash(db, Some(&alice), &["rules", "revoke", &rule]));
    assert_eq!(said.trim(), format!("{rule} revoked by alice"));
    let active: Value = serde_json::from_str(&ok(leash(db, None, &["rules", "list", "--active", "--json"]))).unwrap();
    assert_eq!(active["rules"], serde_json::json!([]), "{active}");
}
