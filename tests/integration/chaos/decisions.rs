//! The decision chaos run on PostgreSQL: two `leash serve` replicas on one
//! database, 500 gated jobs submitted by four principals while twenty
//! approvers race to approve, reject, remember and revoke over HTTP, an
//! operator cancels, and the replicas are SIGKILLed and restarted. Then the
//! checker reads the store and the audit trail and proves: every job was
//! submitted once and ended; each was decided at most once (quorum 1: at
//! most one approval, one decision); every decision is in the audit trail
//! exactly once, in its decider's name (a standing rule's in its author's,
//! naming the rule) and no decision row lacks its decision; no rule
//! decided after its revocation (audit order); every `200` an approver
//! heard is the job's decision by that approver; a rejected job, and one
//! whose cancel was answered `cancelled`, never started; and the chain
//! verifies.
//!
//! ```sh
//! cargo test -p leash --test integration chaos::decisions -- --ignored --nocapture
//! ```
//! prints the figures RELIABILITY.md records (`LEASH_CHAOS_SEED` replays
//! the random choices; the interleaving is the machine's).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use leash::job::{Job, JobStatus, Verdict};
use leash::store::postgres::PostgresStore;
use leash::store::{Audit, AuditListParams, AuditRecord, JobListParams, Jobs, verify_chain};
use reqwest::Method;
use serde_json::{Value, json};

use crate::chaos::{Rng, seed};
use crate::support::pg::{Schema, url};
use crate::support::server::Server;

const JOBS: u64 = 500;
const APPROVERS: usize = 20;
const SUBMITTERS: usize = 4;
const KILLS: u32 = 6;
/// Distinct inputs: jobs alike enough for rules to match.
const INPUTS: u64 = 8;

/// Where the replicas answer now (a restarted one moves port).
type Urls = Arc<RwLock<Vec<String>>>;

/// The replicas as a client sees them.
#[derive(Clone)]
struct Replicas {
    http: reqwest::Client,
    urls: Urls,
}

impl Replicas {
    /// One request to replica `first`, then the other if that one is down;
    /// `None` when neither answered.
    async fn send(
        &self,
        first: usize,
        token: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        key: Option<&str>,
    ) -> Option<(u16, Value)> {
        for i in 0..2 {
            let base = self.urls.read().unwrap()[(first + i) % 2].clone();
            let mut request = self.http.request(method.clone(), format!("{base}{path}")).bearer_auth(token);
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            let Ok(response) = request.timeout(Duration::from_secs(20)).send().await else { continue };
            let status = response.status().as_u16();
            let Ok(bytes) = response.bytes().await else { continue };
            return Some((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)));
        }
        None
    }
}

/// What the approvers heard: a `200` decision (job, approver, verdict).
type Heard = Arc<Mutex<Vec<(String, String, Verdict)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long: CI's long step runs it; see tests/README.md"]
async fn decisions_on_two_postgres_replicas_are_made_once_and_audited_through_kills() {
    let Some(base) = url() else { return };
    let seed = seed();
    eprintln!("decision chaos: seed {seed} (LEASH_CHAOS_SEED replays it)");
    let started = Instant::now();
    let schema = Schema::create(&base).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file: PathBuf = dir.path().join("token");
    let start = {
        let (db, token_file) = (schema.url.clone(), token_file.clone());
        move || {
            let (db, token_file) = (db.clone(), token_file.clone());
            tokio::task::spawn_blocking(move || Server::start_on(db.as_ref(), &token_file, &[], |_| {}))
        }
    };
    let servers = vec![start().await.unwrap(), start().await.unwrap()];
    let a = &servers[0];
    crate::api::duties::gated_hello(a, json!({})).await;
    let mut submitters = Vec::new();
    for i in 0..SUBMITTERS {
        submitters.push(a.principal(&format!("sub{i}"), &["submit"]).await);
    }
    let mut approvers = Vec::new();
    for i in 0..APPROVERS {
        approvers.push((format!("ap{i}"), a.principal(&format!("ap{i}"), &["approve"]).await));
    }
    let operator = a.principal("op", &["operate"]).await;
    let urls: Urls = Arc::new(RwLock::new(servers.iter().map(|s| s.url.clone()).collect()));
    let servers = Arc::new(Mutex::new(servers));
    let replicas = Replicas { http: reqwest::Client::new(), urls: urls.clone() };
    let stop = Arc::new(AtomicBool::new(false));
    let heard: Heard = Arc::default();
    let tally: Arc<Mutex<BTreeMap<&'static str, u64>>> = Arc::default();
    let count =
        |tally: &Arc<Mutex<BTreeMap<&'static str, u64>>>, what| *tally.lock().unwrap().entry(what).or_default() += 1;

    // Submitters: every job under its own idempotency key, retried until
    // a replica answers, so a kill mid-request neither loses nor doubles it.
    let mut tasks = Vec::new();
    for (s, token) in submitters.iter().enumerate() {
        let (replicas, token, tally) = (replicas.clone(), token.clone(), tally.clone());
        let mut rng = Rng(seed ^ ((s as u64 + 1) * 7919));
        tasks.push(tokio::spawn(async move {
            for n in (s as u64..JOBS).step_by(SUBMITTERS) {
                let body = json!({ "plugin": "hello@1", "execution": "async", "input": { "name": format!("n{}", n % INPUTS) } });
                let key = format!("job-{n}");
                loop {
                    let first = rng.below(2) as usize;
                    match replicas.send(first, &token, Method::POST, "/v1/jobs", Some(&body), Some(&key)).await {
                        Some((202 | 200, answer)) => {
                            let on_arrival = answer["status"] != "pending_approval";
                            count(&tally, if on_arrival { "approved_on_arrival" } else { "submitted" });
                            break;
                        }
                        Some((status, answer)) if status < 500 => panic!("submit refused: {status} {answer}"),
                        _ => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
            }
        }));
    }
    let submitting: Vec<_> = std::mem::take(&mut tasks);
    // A backlog first, so that a rule finds waiting jobs like its own.
    crate::support::eventually("a backlog of 100 jobs", async || {
        (tally.lock().unwrap().values().sum::<u64>() >= 100).then_some(())
    })
    .await;

    // Approvers: race on what waits.
    for (i, (name, token)) in approvers.iter().enumerate() {
        let (replicas, name, token) = (replicas.clone(), name.clone(), token.clone());
        let (stop, heard, tally) = (stop.clone(), heard.clone(), tally.clone());
        let mut rng = Rng(seed ^ ((i as u64 + 101) * 104_729));
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let first = rng.below(2) as usize;
                let path = "/v1/jobs?status=pending_approval&limit=100";
                let Some((200, page)) = replicas.send(first, &token, Method::GET, path, None, None).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let waiting = page["jobs"].as_array().cloned().unwrap_or_default();
                if waiting.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let id = waiting[rng.below(waiting.len() as u64) as usize]["id"].as_str().unwrap().to_owned();
                let roll = rng.below(100);
                if roll < 5 {
                    // Revoke one of its own rules still standing.
                    let path = format!("/v1/rules?author={name}&active=true");
                    if let Some((200, rules)) = replicas.send(first, &token, Method::GET, &path, None, None).await
                        && let Some(rule) = rules["rules"].as_array().and_then(|r| r.first())
                    {
                        let path = format!("/v1/rules/{}/revoke", rule["id"].as_str().unwrap());
                        let revoked = replicas.send(first, &token, Method::POST, &path, None, None).await;
                        count(&tally, if matches!(revoked, Some((200, _))) { "rules_revoked" } else { "refused" });
                    }
                    continue;
                }
                let (verdict, body) = match roll {
                    5..15 => (
                        Verdict::Approved,
                        json!({ "remember": { "ttl_ms": 3_600_000, "any_submitter": rng.below(2) == 0 } }),
                    ),
                    15..30 => (Verdict::Rejected, json!({ "comment": "no" })),
                    _ => (Verdict::Approved, json!({})),
                };
                let action = if verdict == Verdict::Approved { "approve" } else { "reject" };
                let path = format!("/v1/jobs/{id}/{action}");
                match replicas.send(first, &token, Method::POST, &path, Some(&body), None).await {
                    Some((200, _)) => {
                        heard.lock().unwrap().push((id, name.clone(), verdict));
                        count(&tally, if body.get("remember").is_some() { "remembered" } else { action });
                    }
                    Some((409 | 403 | 404, _)) => count(&tally, "refused"),
                    Some((status, answer)) => panic!("{action} {id}: unexpected {status} {answer}"),
                    None => count(&tally, "unanswered"),
                }
            }
        }));
    }

    // The operator cancels now and then.
    let cancels: Arc<Mutex<Vec<String>>> = Arc::default();
    {
        let (replicas, stop, tally, cancels) = (replicas.clone(), stop.clone(), tally.clone(), cancels.clone());
        let mut rng = Rng(seed ^ 0xC0FFEE);
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100 + rng.below(200))).await;
                let path = "/v1/jobs?status=pending_approval&limit=100";
                let first = rng.below(2) as usize;
                let Some((200, page)) = replicas.send(first, &operator, Method::GET, path, None, None).await else {
                    continue;
                };
                let Some(job) = page["jobs"].as_array().and_then(|w| w.get(rng.below(w.len().max(1) as u64) as usize))
                else {
                    continue;
                };
                let path = format!("/v1/jobs/{}/cancel", job["id"].as_str().unwrap());
                match replicas.send(first, &operator, Method::POST, &path, None, None).await {
                    Some((200, answer)) if answer["status"] == "cancelled" => {
                        cancels.lock().unwrap().push(answer["job_id"].as_str().unwrap().to_owned());
                        count(&tally, "cancelled");
                    }
                    Some((202, _)) => count(&tally, "cancel_requested"),
                    _ => count(&tally, "refused"),
                }
            }
        }));
    }

    // Kill a replica at random moments, and start it again.
    let mut rng = Rng(seed);
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(800 + rng.below(1_500))).await;
        let victim = rng.below(2) as usize;
        servers.lock().unwrap()[victim].kill();
        count(&tally, "kills");
        let replaced = start().await.unwrap();
        urls.write().unwrap()[victim] = replaced.url.clone();
        servers.lock().unwrap()[victim] = replaced;
    }
    for task in submitting {
        task.await.unwrap();
    }
    // Let the racing go on a moment past the last submit, then stop it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }

    let store = PostgresStore::open(&schema.url).await.unwrap();
    // What still waits is approved by one approver, who never submitted.
    let closer = &approvers[0].1;
    loop {
        let waiting = store
            .job_list(JobListParams { status: vec![JobStatus::PendingApproval], limit: 500, ..Default::default() })
            .await
            .unwrap();
        if waiting.is_empty() {
            break;
        }
        for job in waiting {
            let path = format!("/v1/jobs/{}/approve", job.id);
            let answer = replicas.send(0, closer, Method::POST, &path, Some(&json!({})), None).await;
            if let Some((200, _)) = answer {
                heard.lock().unwrap().push((job.id.to_string(), approvers[0].0.clone(), Verdict::Approved));
            }
        }
    }
    let jobs: Vec<Job> = crate::support::eventually("every job ends", async || {
        let jobs = all_jobs(&store).await;
        jobs.iter().all(|j| j.status.is_terminal()).then_some(jobs)
    })
    .await;
    let rows = all_rows(&store).await;
    check(&jobs, &rows, &heard.lock().unwrap());
    for id in cancels.lock().unwrap().iter() {
        let job = jobs.iter().find(|j| j.id.to_string() == *id).unwrap();
        assert_eq!(job.status, JobStatus::Cancelled, "{id}: its cancel was answered `cancelled`: {job:?}");
        assert!(job.started_at.is_none(), "{id}: cancelled while waiting, it never started");
    }
    let head = store.audit_head().await.unwrap();
    let verdict = verify_chain(&head, |after| {
        store.audit_list(AuditListParams { after: Some(after), limit: 1_000, ..AuditListParams::default() })
    })
    .await
    .unwrap();
    assert_eq!(verdict, Ok(head.clone()), "the chain verifies");

    let mut ended: BTreeMap<String, u64> = BTreeMap::new();
    for job in &jobs {
        let how = match (job.status, job.error_kind) {
            (status, Some(kind)) => format!("{status}/{kind}"),
            (status, None) => status.to_string(),
        };
        *ended.entry(how).or_default() += 1;
    }
    let by_rule = jobs.iter().filter(|j| decision_of(j).and_then(|d| d.rule.as_ref()).is_some()).count();
    let on_arrival = tally.lock().unwrap().get("approved_on_arrival").copied().unwrap_or(0);
    eprintln!(
        "decision chaos: {} jobs, {by_rule} approved by a standing rule ({} when it was made, the rest on arrival); \
         {:?}; ended {ended:?}; {} audit rows; {:.0} s",
        jobs.len(),
        by_rule as u64 - on_arrival,
        tally.lock().unwrap(),
        head.seq,
        started.elapsed().as_secs_f64()
    );
}

async fn all_jobs(store: &PostgresStore) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut before = None;
    loop {
        let page = store.job_list(JobListParams { before, limit: 500, ..Default::default() }).await.unwrap();
        before = page.last().map(|j| j.id);
        let last = page.len() < 500;
        for listed in page {
            jobs.push(store.job_get(listed.id).await.unwrap().unwrap());
        }
        if last {
            return jobs;
        }
    }
}

async fn all_rows(store: &PostgresStore) -> Vec<AuditRecord> {
    let mut rows: Vec<AuditRecord> = Vec::new();
    loop {
        let after = rows.last().map(|r| r.seq);
        let page =
            store.audit_list(AuditListParams { after, limit: 1_000, ..AuditListParams::default() }).await.unwrap();
        if page.is_empty() {
            return rows;
        }
        rows.extend(page);
    }
}

fn decision_of(job: &Job) -> Option<&leash::job::Decision> {
    job.approval.as_ref().and_then(|a| a.decision.as_ref())
}

/// The run's rules, over the jobs as they ended and the whole trail.
fn check(jobs: &[Job], rows: &[AuditRecord], heard: &[(String, String, Verdict)]) {
    assert_eq!(jobs.len() as u64, JOBS, "every job submitted once");
    let mut decided: HashMap<&str, Vec<&AuditRecord>> = HashMap::new();
    let mut revoked_at: HashMap<&str, i64> = HashMap::new();
    for row in rows {
        match row.action.as_str() {
            "job.approve" | "job.reject" => decided.entry(row.target.as_str()).or_default().push(row),
            "rule.revoke" => {
                revoked_at.insert(row.target.as_str(), row.seq);
            }
            _ => {}
        }
    }
    for job in jobs {
        let id = job.id.to_string();
        let approval = job.approval.as_ref().expect("every job was gated");
        assert!(approval.approvals.len() <= 1, "{id}: decided at most once (quorum 1): {approval:?}");
        let rows = decided.get(id.as_str()).cloned().unwrap_or_default();
        match &approval.decision {
            None => assert!(rows.is_empty(), "{id}: a decision row without its decision: {rows:?}"),
            Some(decision) => {
                assert_eq!(rows.len(), 1, "{id}: its decision is in the trail once: {rows:?}");
                let row = rows[0];
                assert_eq!(row.principal.as_deref(), Some(decision.by.as_str()), "{id}: in its decider's name");
                let detail: Value = serde_json::from_str(&row.detail).unwrap();
                assert_eq!(detail["rule"].as_str(), decision.rule.as_deref(), "{id}: the rule named: {detail}");
                if let Some(rule) = &decision.rule {
                    let revoked = revoked_at.get(rule.as_str()).copied().unwrap_or(i64::MAX);
                    assert!(row.seq < revoked, "{id}: rule {rule} decided after its revocation");
                }
                if decision.verdict == Verdict::Rejected {
                    assert!(job.started_at.is_none(), "{id}: rejected, it never started");
                }
            }
        }
        assert!(job.status.is_terminal(), "{id}: ended");
    }
    let by_id: HashMap<String, &Job> = jobs.iter().map(|j| (j.id.to_string(), j)).collect();
    for (id, who, verdict) in heard {
        let decision = decision_of(by_id[id]).unwrap_or_else(|| panic!("{id}: {who} heard 200, no decision"));
        assert_eq!((decision.by.as_str(), decision.verdict), (who.as_str(), *verdict), "{id}: what {who} heard");
    }
}
