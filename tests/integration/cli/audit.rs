//! The audit trail as an operator uses it, on SQLite and on PostgreSQL:
//! the CLI's changes land in it as their principal's, `leash audit verify`
//! finds the chain intact, and finds it broken where a row was edited or
//! cut by hand in the database.

use std::process::Output;

use serde_json::Value;

use crate::support::pg;
use crate::support::server::leash_bin;

/// `leash ARGS --db DB`, as the bootstrap admin or as `token`'s principal.
pub(crate) fn leash(db: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = leash_bin();
    command.args(args).args(["--db", db]);
    if let Some(token) = token {
        command.env("LEASH_API_TOKEN", token);
    }
    command.output().expect("run leash")
}

pub(crate) fn ok(output: Output) -> String {
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{said}\n{}", String::from_utf8_lossy(&output.stderr));
    said
}

/// Changes through the CLI, each audited: principals, a token, a
/// registration and its policy, a submit, an approval by another
/// principal, a revocation. Answers the rows as `audit list --json` shows.
fn audited_changes(db: &str) -> Vec<Value> {
    ok(leash(db, None, &["principals", "add", "alice", "--role", "approve", "--max-running", "2"]));
    let principals: Value = serde_json::from_str(&ok(leash(db, None, &["principals", "list", "--json"]))).unwrap();
    assert_eq!(principals["principals"][0]["ceilings"], serde_json::json!({ "max_running": 2 }), "{principals}");
    let table = ok(leash(db, None, &["principals", "list"]));
    assert!(table.lines().any(|l| l.contains("alice") && l.contains("running 2")), "{table}");
    let alice = ok(leash(db, None, &["tokens", "create", "alice"])).trim().to_owned();
    let hello = leash_tests::plugin_path("hello");
    ok(leash(db, None, &["plugins", "add", hello.to_str().unwrap(), "--name", "hello", "--version", "1"]));
    ok(leash(db, None, &["plugins", "approval", "hello@1", "--require", "execute"]));
    let id = ok(leash(db, None, &["submit", "hello@1"])).trim().to_owned();
    ok(leash(db, Some(&alice), &["jobs", "approve", &id, "--comment", "looked"]));
    let listed: Value = serde_json::from_str(&ok(leash(db, None, &["tokens", "list", "--json"]))).unwrap();
    let token_id = listed["tokens"][0]["id"].as_str().unwrap().to_owned();
    ok(leash(db, None, &["tokens", "revoke", &token_id]));
    let page: Value =
        serde_json::from_str(&ok(leash(db, None, &["audit", "list", "--limit", "100", "--json"]))).unwrap();
    let rows = page["rows"].as_array().unwrap().clone();
    let said: Vec<(Option<&str>, &str)> =
        rows.iter().map(|r| (r["principal"].as_str(), r["action"].as_str().unwrap())).collect();
    let expected = [
        (Some("admin"), "principal.put"),
        (Some("admin"), "token.create"),
        (Some("admin"), "plugin.register"),
        (Some("admin"), "plugin.policy"),
        (Some("admin"), "job.submit"),
        (Some("alice"), "job.approve"),
        (Some("admin"), "token.revoke"),
    ];
    let mut at = said.iter();
    for want in expected {
        assert!(at.any(|got| *got == want), "{want:?} missing or out of order in {said:?}");
    }
    let approve = rows.iter().find(|r| r["action"] == "job.approve").unwrap();
    assert_eq!(approve["target"], id.as_str());
    assert!(approve["detail"].as_str().unwrap().contains("looked"), "{approve}");
    rows
}

/// `leash audit verify`: its exit status and what it said.
fn verify(db: &str) -> (Option<i32>, String) {
    let output = leash(db, None, &["audit", "verify"]);
    (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn verify_finds_a_row_edited_or_cut_by_hand_in_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.db");
    let db = path.to_str().unwrap();
    let rows = audited_changes(db);
    let (code, said) = verify(db);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.starts_with(&format!("intact: {} rows", rows.len())), "{said}");

    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("UPDATE audit SET principal = 'mallory' WHERE action = 'job.approve'", []).unwrap();
    let edited: i64 = conn.query_row("SELECT seq FROM audit WHERE action = 'job.approve'", [], |r| r.get(0)).unwrap();
    let (code, said) = verify(db);
    assert_eq!(code, Some(10), "{said}");
    assert!(said.starts_with(&format!("broken at row {edited}:")), "{said}");
    conn.execute("UPDATE audit SET principal = 'alice' WHERE seq = ?1", [edited]).unwrap();
    assert_eq!(verify(db).0, Some(0), "put back as it was, it holds again");

    conn.execute("DELETE FROM audit WHERE seq = (SELECT MAX(seq) FROM audit)", []).unwrap();
    let (code, said) = verify(db);
    assert_eq!(code, Some(10), "{said}");
    assert!(said.contains("removed from its end"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_a_row_edited_by_hand_in_postgres() {
    let Some(base) = pg::url() else { return };
    let schema = pg::Schema::create(&base).await;
    let db = schema.url.clone();
    let rows = tokio::task::spawn_blocking(move || audited_changes(&db)).await.unwrap();
    let db = schema.url.clone();
    let (code, said) = tokio::task::spawn_blocking(move || verify(&db)).await.unwrap();
    assert_eq!(code, Some(0), "{said}");
    assert!(said.starts_with(&format!("intact: {} rows", rows.len())), "{said}");
    let seq = rows.iter().find(|r| r["action"] == "plugin.policy").unwrap()["seq"].as_i64().unwrap();
    schema.execute(&format!("UPDATE audit SET detail = '{{\"after\":null}}' WHERE seq = {seq}")).await;
    let db = schema.url.clone();
    let (code, said) = tokio::task::spawn_blocking(move || verify(&db)).await.unwrap();
    assert_eq!(code, Some(10), "{said}");
    assert!(said.starts_with(&format!("broken at row {seq}:")), "{said}");
}
