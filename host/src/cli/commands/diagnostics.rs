//! `leash diagnostics`: every worker sharing the database, the queue and
//! the ceilings.

use super::*;

pub(in crate::cli) async fn diagnostics(args: DiagnosticsArgs) -> Result<ExitStatus, CliError> {
    let json_out = args.conn.json;
    with_client(&args.conn, false, async move |client| {
        let report = client.json(Method::GET, "/v1/health", None).await?;
        if json_out {
            return print_json(&report).map(|()| ExitStatus::Success);
        }
        let health = &report["health"];
        let counts = &health["counts"];
        let _ = writeln!(std::io::stdout(), "{}", text(&health["summary"]));
        let mut table = new_table(&["CHECK", "VALUE"]);
        let rows = [
            ("target", client.target()),
            ("client version", env!("CARGO_PKG_VERSION").to_owned()),
            (
                "queue",
                ["queued", "running", "succeeded", "failed", "cancelled"]
                    .iter()
                    .map(|k| format!("{k} {}", text(&counts[*k])))
                    .chain([format!(
                        "total {}",
                        ["queued", "running", "succeeded", "failed", "cancelled"]
                            .iter()
                            .map(|k| counts[*k].as_u64().unwrap_or(0))
                            .sum::<u64>()
                    )])
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("max timeout", format!("{} ms", text(&report["ceilings"]["max_timeout_ms"]))),
            ("max memory", format!("{} bytes", text(&report["ceilings"]["max_memory_bytes"]))),
            ("max output", format!("{} bytes", text(&report["ceilings"]["max_output_bytes"]))),
        ];
        for (check, value) in rows {
            table.add_row(vec![check.to_owned(), value]);
        }
        print_table(table);
        let mut workers = new_table(&[
            "WORKER",
            "HOST",
            "PID",
            "STATE",
            "SLOTS",
            "RUNNING",
            "DONE/FAILED/CANCELLED",
            "LAST HEARTBEAT",
            "JOBS",
        ]);
        for worker in health["workers"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let state = if worker["stale"] == true {
                format!("stale ({})", text(&worker["state"]))
            } else {
                text(&worker["state"])
            };
            let jobs: Vec<String> =
                worker["running_jobs"].as_array().map(|a| a.iter().map(text).collect()).unwrap_or_default();
            workers.add_row(vec![
                text(&worker["worker_id"]),
                text(&worker["host"]),
                text(&worker["pid"]),
                state,
                text(&worker["slots"]),
                text(&worker["running"]),
                format!("{}/{}/{}", text(&worker["processed"]), text(&worker["failed"]), text(&worker["cancelled"])),
                text(&worker["last_heartbeat"]),
                jobs.join(" "),
            ]);
        }
        print_table(workers);
        Ok(ExitStatus::Success)
    })
    .await
}
