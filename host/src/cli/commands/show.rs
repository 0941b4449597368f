//! `leash jobs show` for a person: where the job is and why first (its
//! status, its error), then what it ran, when, and with what; values
//! wrapped to the terminal, in human units (`1 h · 64 MiB`). `--json` has
//! every field.

use std::fmt::Write as _;
use std::time::Duration;

use comfy_table::Table;

use super::connect::new_table;
use crate::api::types::JobView;
use crate::cli::{terminal_lines, terminal_text};
use crate::clock::Timestamp;
use crate::job::{Attempt, GateSource, Job, JobStatus, Verdict};

/// Width of the labels column.
const LABEL: usize = 10;

/// Backtrace frames shown before the rest are left to `--json`.
const FRAMES: usize = 12;

pub(crate) use crate::clock::human_duration;

/// A size as a person reads it: `512 B`, `1.1 MiB`, `64 MiB`, `2 GiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let shown = format!("{value:.1}");
    format!("{} {}", shown.strip_suffix(".0").unwrap_or(&shown), UNITS[unit])
}

/// A count with thousands separated: `6,025`.
fn human_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `text` cut to `room` characters, the cut marked with `…`.
fn cut(text: &str, room: usize) -> String {
    match text.chars().count() > room {
        true => format!("{}…", text.chars().take(room.saturating_sub(1)).collect::<String>()),
        false => text.to_owned(),
    }
}

/// The time from `from` to `to`, none when `to` is earlier.
fn between(from: Timestamp, to: Timestamp) -> Duration {
    Duration::from_millis(u64::try_from(to.unix_ms() - from.unix_ms()).unwrap_or(0))
}

/// Lines of `label  value`, the value wrapped to the width under its
/// first line.
struct Page {
    text: String,
    width: usize,
}

impl Page {
    fn field(&mut self, label: &str, value: &str) {
        let indent = " ".repeat(LABEL);
        let first = format!("{label:<LABEL$}");
        let options = textwrap::Options::new(self.width.max(LABEL + 20))
            .initial_indent(&first)
            .subsequent_indent(&indent)
            .break_words(true);
        for line in textwrap::wrap(value, options) {
            let _ = writeln!(self.text, "{}", line.trim_end());
        }
    }

    /// A value of many lines (guest text): each made safe and wrapped,
    /// the label on the first.
    fn lines(&mut self, label: &str, value: &str) {
        for (i, line) in terminal_lines(value).enumerate() {
            self.field(if i == 0 { label } else { "" }, &line);
        }
    }
}

/// Where the job is, in one line: its status and what it waits for or
/// how it ended.
fn status_line(job: &Job, now: Timestamp) -> String {
    let attempts = attempts_text(job);
    match job.status {
        JobStatus::Queued if job.run_after > now => format!(
            "queued, not before {} (in {}) · attempts {attempts}",
            job.run_after,
            human_duration(between(now, job.run_after))
        ),
        JobStatus::Queued => {
            format!("queued for {} · attempts {attempts}", human_duration(between(job.run_after, now)))
        }
        JobStatus::PendingApproval => {
            format!("waiting for approval for {}", human_duration(between(job.created_at, now)))
        }
        JobStatus::Approved => "approved, waiting for its run trigger (`leash jobs run`)".to_owned(),
        JobStatus::Running => {
            let ran = job.started_at.map(|at| human_duration(between(at, now))).unwrap_or_default();
            let beat =
                job.last_heartbeat.map(|at| format!(", last heartbeat {} ago", human_duration(between(at, now))));
            format!(
                "running for {ran} on {} · attempts {attempts}{}",
                job.worker_id.as_deref().map(terminal_text).unwrap_or_default(),
                beat.unwrap_or_default()
            )
        }
        status => {
            let kind = job.error_kind.map(|k| format!(" ({k})")).unwrap_or_default();
            format!("{status}{kind} · attempts {attempts}")
        }
    }
}

/// The whole page.
pub(super) fn job_text(view: &JobView, attempts: &[Attempt], now: Timestamp, width: usize) -> String {
    let job = &view.job;
    let mut page = Page { text: String::new(), width };
    page.field("job", &job.id.to_string());
    page.field("status", &status_line(job, now));
    if let Some(error) = &job.error_message {
        page.lines("error", error);
    } else if let Some(error) = &job.last_error {
        page.lines("last try", error);
    }
    if let Some(p) = &job.progress {
        let done = match p.total {
            0 => human_count(p.done),
            total => format!("{} of {}", human_count(p.done), human_count(total)),
        };
        let note = if p.note.is_empty() { String::new() } else { format!(" · {}", terminal_text(&p.note)) };
        page.field("progress", &format!("{done}{note}"));
    }
    let digest = super::connect::short_digest(&job.plugin.to_string());
    let plugin = match &job.plugin_name {
        Some(name) => format!("{} ({digest})", terminal_text(&name.to_string())),
        None => digest,
    };
    page.field("plugin", &format!("{plugin} · {}", terminal_text(&job.target.to_string())));
    if let Some(plan) = &job.plan_id {
        page.field("plan", &terminal_text(plan));
    }
    if let Some(key) = &job.concurrency_key {
        page.field("key", &terminal_text(key));
    }
    if job.priority > 0 {
        page.field("priority", &format!("{} (0 is claimed first)", job.priority));
    }
    if !job.tags.is_empty() {
        page.field("tags", &terminal_text(&job.tags.join(", ")));
    }
    if !job.metadata.is_empty() {
        page.field("metadata", &terminal_text(&serde_json::Value::Object(job.metadata.clone()).to_string()));
    }
    if let Some(schedule) = job.schedule_id {
        page.field("schedule", &schedule.to_string());
    }
    if let Some(limit) = &job.rate_limit {
        let key =
            if job.rate_key.is_empty() { String::new() } else { format!(" · key {}", terminal_text(&job.rate_key)) };
        let waiting = match job.rate_slot {
            Some(slot) if job.waiting_rate(crate::clock::Timestamp::now()) => format!(" · waiting_rate until {slot}"),
            _ => String::new(),
        };
        page.field("rate limit", &format!("{}{key}{waiting}", terminal_text(limit)));
    }
    let by = job.submitted_by.as_deref().map(|p| format!(" by {}", terminal_text(p))).unwrap_or_default();
    page.field("submitted", &format!("{}{by}", job.created_at));
    let mut timings = Vec::new();
    if let Some(started) = job.started_at {
        // The wait before the last run: from when it could run.
        let ready = job.run_after.min(started).max(job.created_at);
        timings.push(format!("waited {}", human_duration(between(ready, started))));
        if let Some(finished) = job.finished_at {
            timings.push(format!("ran {}", human_duration(between(started, finished))));
        }
    }
    if let Some(finished) = job.finished_at {
        timings.push(format!("ended {finished}"));
    } else if !job.status.is_terminal() {
        timings.push(format!("expires {} unless claimed", job.expires_at));
    }
    if let Some(deadline) = job.deadline_at {
        timings.push(format!("deadline {deadline}"));
    }
    if !timings.is_empty() {
        page.field("timings", &timings.join(" · "));
    }
    let limits = &job.limits;
    page.field(
        "limits",
        &format!(
            "timeout {} · memory {} · output {} · fuel {}",
            human_duration(limits.timeout),
            human_bytes(limits.memory_bytes),
            human_bytes(limits.output_bytes),
            limits.fuel.map_or_else(|| "unlimited".to_owned(), human_count)
        ),
    );
    let mut used = Vec::new();
    if let Some(fuel) = job.fuel_used {
        used.push(format!("fuel {}", human_count(fuel)));
    }
    if let Some(peak) = job.peak_memory_bytes {
        used.push(format!("peak memory {}", human_bytes(peak)));
    }
    if let Some(n) = view.output_bytes {
        used.push(format!("output {}", human_bytes(n as u64)));
    }
    if !used.is_empty() {
        page.field("used", &used.join(" · "));
    }
    if let (Some(worker), false) = (&job.worker_id, job.status == JobStatus::Running) {
        page.field("worker", &terminal_text(worker));
    }
    let grants = &job.grants.http;
    for (i, rule) in grants.hosts.iter().enumerate() {
        page.field(if i == 0 { "grants" } else { "" }, &terminal_text(&rule.to_string()));
    }
    let mut more = Vec::new();
    more.extend(grants.private_ranges.iter().map(|range| format!("private {range}")));
    more.extend(grants.secrets.iter().map(|binding| format!("secret {}", binding.name)));
    if !job.grants.config.is_empty() {
        let keys: Vec<&str> = job.grants.config.keys().map(String::as_str).collect();
        more.push(format!("config {}", keys.join(", ")));
    }
    for (i, line) in more.iter().enumerate() {
        let label = if i == 0 && grants.hosts.is_empty() { "grants" } else { "" };
        page.field(label, &terminal_text(line));
    }
    if let Some(approval) = &job.approval {
        let asked = match approval.required_by {
            GateSource::Request => "asked for at submit",
            GateSource::Policy => "required by the plugin's policy",
            GateSource::Plan => "required by its plan",
        };
        let said = match &approval.decision {
            Some(d) => {
                let verdict = match d.verdict {
                    Verdict::Approved => "approved",
                    Verdict::Rejected => "rejected",
                };
                format!("{asked}; {verdict} by {} at {}", terminal_text(&d.by), d.at)
            }
            None => format!("{asked}; not decided"),
        };
        page.field("approval", &said);
    }
    if let Some(backtrace) = &job.backtrace {
        // A frame per line, cut rather than wrapped: a frame's name is one
        // word, and `--json` has it whole.
        let frames: Vec<String> = terminal_lines(backtrace).collect();
        let room = width.saturating_sub(LABEL + 1).max(20);
        for (i, frame) in frames.iter().take(FRAMES).enumerate() {
            let frame = cut(frame, room);
            let _ = writeln!(page.text, "{:<LABEL$}{frame}", if i == 0 { "backtrace" } else { "" });
        }
        if frames.len() > FRAMES {
            page.field("", &format!("… {} more frames (--json shows them all)", frames.len() - FRAMES));
        }
    }
    if !attempts.is_empty() {
        let _ = writeln!(page.text);
        let _ = write!(page.text, "{}", attempts_table(attempts, width));
    }
    page.text
}

/// Attempts spent of the job's most, and its runs when some spent none (a
/// release, a free re-run): `1/1 (2 runs)`, never `2/1`.
pub(super) fn attempts_text(job: &crate::job::Job) -> String {
    // The last run spent its attempt if it is running or ended the job; a
    // queued job's earlier runs spent only what the counters say.
    let last = job.status == JobStatus::Running || (job.status.is_terminal() && job.attempt > 0);
    attempts_shown(job.attempt, job.lost_leases + job.retries + u32::from(last), job.max_attempts)
}

fn attempts_shown(runs: u32, spent: u32, max_attempts: u32) -> String {
    let spent = spent.min(runs);
    match runs - spent {
        0 => format!("{spent}/{max_attempts}"),
        _ if runs == 1 => format!("{spent}/{max_attempts} (1 run)"),
        _ => format!("{spent}/{max_attempts} ({runs} runs)"),
    }
}

/// A job's attempts as a table at most `width` columns wide: one row
/// each, its error's first line cut to fit (`leash jobs attempts --json`
/// has it whole).
pub(super) fn attempts_table(attempts: &[Attempt], width: usize) -> Table {
    let header = ["RUN", "WORKER", "STARTED", "TOOK", "ENDED AS", "ERROR"];
    let rows: Vec<[String; 5]> = attempts
        .iter()
        .map(|a| {
            let mut ended = a.outcome.clone();
            if a.logs_cut {
                ended.push_str(" (logs cut)");
            }
            [
                a.run.to_string(),
                a.worker_id.as_deref().map(terminal_text).unwrap_or_default(),
                // To the second, a space for the T: the job's page has the
                // exact times.
                a.started_at
                    .map(|t| t.to_string().get(..19).unwrap_or_default().replacen('T', " ", 1))
                    .unwrap_or_default(),
                a.duration().map_or_else(|| "-".to_owned(), human_duration),
                ended,
            ]
        })
        .collect();
    // Each column is its widest cell and a space either side; on a narrow
    // terminal the worker goes first, so the error keeps 20 columns.
    let widest = |c: usize| rows.iter().map(|r| r[c].chars().count()).chain([header[c].len()]).max().unwrap_or(0) + 2;
    let all: usize = (0..5).map(widest).sum();
    let keep_worker = width >= all + 2 + 20;
    let used = if keep_worker { all } else { all - widest(1) };
    let room = width.saturating_sub(used + 2).max(20);
    let columns: Vec<usize> = (0..6).filter(|&c| c != 1 || keep_worker).collect();
    let mut table = new_table(&columns.iter().map(|&c| header[c]).collect::<Vec<_>>());
    for (a, row) in attempts.iter().zip(rows) {
        let error = a.error.as_deref().and_then(|e| e.lines().next()).map(terminal_text).unwrap_or_default();
        let error = cut(&error, room);
        let mut cells = row.to_vec();
        cells.push(error);
        table.add_row(columns.iter().map(|&c| cells[c].clone()).collect::<Vec<_>>());
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_says_what_the_job_waits_for() {
        let now: Timestamp = serde_json::from_value(serde_json::json!("2026-12-05T04:22:00.000Z")).unwrap();
        let cases = [
            (serde_json::json!({"attempt": 0}), "queued for 2 min · attempts 0/3"),
            (
                serde_json::json!({"run_after": "2026-12-05T04:22:30.000Z", "retries": 1}),
                "queued, not before 2026-12-05T04:22:30.000Z (in 30 s) · attempts 1/3",
            ),
            (
                serde_json::json!({"status": "running", "started_at": "2026-12-05T04:21:19.000Z",
                    "last_heartbeat": "2026-12-05T04:21:59.200Z", "worker_id": "w-3"}),
                "running for 41 s on w-3 · attempts 1/3, last heartbeat 800 ms ago",
            ),
            (serde_json::json!({"status": "pending_approval", "attempt": 0}), "waiting for approval for 2 min"),
            (serde_json::json!({"status": "failed", "error_kind": "trap"}), "failed (trap) · attempts 1/3"),
        ];
        for (edit, said) in cases {
            assert_eq!(status_line(&Job::for_tests(edit), now), said);
        }
    }

    #[test]
    fn durations_and_sizes_read_as_a_person_says_them() {
        let cases = [
            (Duration::from_millis(14), "14 ms"),
            (Duration::from_millis(1300), "1.3 s"),
            (Duration::from_secs(41), "41 s"),
            (Duration::from_secs(125), "2 min 5 s"),
            (Duration::from_secs(120), "2 min"),
            (Duration::from_secs(3600), "1 h"),
            (Duration::from_secs(12_000), "3 h 20 min"),
            (Duration::from_secs(187_200), "2 d 4 h"),
        ];
        for (d, said) in cases {
            assert_eq!(human_duration(d), said);
        }
        for (n, said) in [(512, "512 B"), (64 << 20, "64 MiB"), (1_114_112, "1.1 MiB"), (3 << 30, "3 GiB")] {
            assert_eq!(human_bytes(n), said);
        }
        assert_eq!(human_count(6025), "6,025");
        assert_eq!(human_count(1_000_000), "1,000,000");
        assert_eq!(human_count(999), "999");
    }

    #[test]
    fn attempts_count_what_was_spent_and_runs_that_spent_nothing_apart() {
        assert_eq!(attempts_shown(0, 0, 1), "0/1", "never run");
        assert_eq!(attempts_shown(1, 1, 1), "1/1");
        assert_eq!(attempts_shown(2, 1, 1), "1/1 (2 runs)", "released once, then ran to its end: not 2/1");
        assert_eq!(attempts_shown(1, 0, 3), "0/3 (1 run)", "released and queued again");
        assert_eq!(attempts_shown(3, 3, 3), "3/3");
    }
}
