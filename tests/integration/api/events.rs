//! `GET /v1/events` and `leash jobs watch` against a real `leash serve`:
//! a client that reconnects with its last id loses nothing, a job run by
//! another process on the same database shows up, and a client that stops
//! reading is dropped while the others keep receiving.

use std::io::{Read, Write};
use std::pin::Pin;
use std::process::Stdio;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use leash::job::{Event, EventKind, JobStatus};
use serde_json::json;

use crate::support::server::{Server, leash_bin};
use crate::support::{GENEROUS, eventually};

type Frames = Pin<Box<dyn Stream<Item = eventsource_stream::Event> + Send>>;

/// One client of the event stream.
struct Client {
    frames: Frames,
}

impl Client {
    /// Connect with `query` (`""` or `?…`), resuming after `last` if given.
    async fn open(server: &Server, query: &str, last: Option<&str>) -> Client {
        let mut request = server.request(reqwest::Method::GET, &format!("/v1/events{query}"));
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = request.send().await.expect("connect");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let frames = response.bytes_stream().eventsource().map(|frame| frame.expect("a well-formed frame"));
        Client { frames: Box::pin(frames) }
    }

    /// The next event (a hang fails the test).
    async fn next(&mut self) -> (eventsource_stream::Event, Event) {
        let frame = tokio::time::timeout(GENEROUS, self.frames.next())
            .await
            .expect("an event within the wait")
            .expect("the stream stays open");
        let event: Event = serde_json::from_str(&frame.data).unwrap_or_else(|e| panic!("{e}: {}", frame.data));
        assert_eq!((frame.id.as_str(), frame.event.as_str()), (event.id.to_string().as_str(), event.kind.as_str()));
        (frame, event)
    }

    /// Events until `done` holds for one (included).
    async fn until(&mut self, done: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let (_, event) = self.next().await;
            let stop = done(&event);
            events.push(event);
            if stop {
                return events;
            }
        }
    }
}

fn finished(event: &Event, id: &str) -> bool {
    event.kind == EventKind::JobFinished && event.job.as_ref().is_some_and(|j| j.id.to_string() == id)
}

async fn submit_hello(server: &Server, name: &str) -> String {
    let body = json!({ "plugin": "hello", "input": { "name": name }, "execution": "async" });
    let (status, answer) = server.call(reqwest::Method::POST, "/v1/jobs", Some(body)).await;
    assert_eq!(status, 202, "{answer}");
    answer["job_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reconnects_after_its_last_event_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &[]);
    server.add_plugin("hello").await;
    let mut watcher = Client::open(&server, "", None).await;
    let mut leaver = Client::open(&server, "", None).await;
    let mut first = Vec::new();
    for i in 0..3 {
        first.push(submit_hello(&server, &format!("a{i}")).await);
    }
    // The leaver reads two events and goes away; more jobs run meanwhile.
    leaver.next().await;
    let (left_at, _) = leaver.next().await;
    drop(leaver);
    let mut second = Vec::new();
    for i in 0..3 {
        second.push(submit_hello(&server, &format!("b{i}")).await);
    }
    let last = second.last().unwrap().clone();
    // Other jobs' ends may follow the last one's: read on to every job's.
    let mut seen = watcher.until(|e| finished(e, &last)).await;
    for id in first.iter().chain(&second) {
        if !seen.iter().any(|e| finished(e, id)) {
            seen.extend(watcher.until(|e| finished(e, id)).await);
        }
    }
    let mut back = Client::open(&server, "", Some(&left_at.id)).await;
    let resumed_from = seen.iter().position(|e| e.id.to_string() == left_at.id).expect("the watcher saw it too");
    let expected: Vec<String> = seen[resumed_from + 1..].iter().map(|e| e.id.to_string()).collect();
    let mut got = Vec::new();
    while got.len() < expected.len() {
        got.push(back.next().await.1.id.to_string());
    }
    assert_eq!(got, expected, "the resumed stream carries on exactly where it left off");
    // Each job's story, as the watcher saw it (hello's one progress report
    // may land before its finish or with it).
    for id in first.iter().chain(&second) {
        let story: Vec<(EventKind, JobStatus)> = seen
            .iter()
            .filter(|e| e.kind != EventKind::JobProgress)
            .filter_map(|e| e.job.as_ref().filter(|j| j.id.to_string() == *id).map(|j| (e.kind, j.status)))
            .collect();
        assert_eq!(
            story,
            [
                (EventKind::JobSubmitted, JobStatus::Queued),
                (EventKind::JobStarted, JobStatus::Running),
                (EventKind::JobFinished, JobStatus::Succeeded)
            ],
            "job {id}"
        );
    }
    // Filters: one job's events only; a bad filter or id is a 400.
    let one = &first[0];
    let mut only = Client::open(&server, &format!("?job={one}&status=succeeded"), Some("0-0")).await;
    let (_, event) = only.next().await;
    assert!(finished(&event, one), "{event:?}");
    for bad in ["?status=done", "?job=nope", "?after=12", "?plugin=Not%20a%20name", "?colour=red"] {
        let (status, answer) = server.call(reqwest::Method::GET, &format!("/v1/events{bad}"), None).await;
        assert_eq!(status, 400, "{bad}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_run_by_another_process_on_the_same_database_shows_up() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    // The server's own pool never polls during the test: only the other
    // process runs the job.
    let server = Server::start(&db, &["--poll-interval", "1h"]);
    server.add_plugin("hello").await;
    let mut client = Client::open(&server, "", None).await;
    let elsewhere = leash::runtime::Runtime::builder(db.as_path())
        .sandbox(leash::sandbox::SandboxConfig { cache_dir: Some(crate::support::cache_dir()), ..Default::default() })
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let submit = leash::runtime::Submit::new(
        leash::runtime::PluginSource::Ref("hello".parse().unwrap()),
        leash::job::Target::Execute,
        br#"{"name":"there"}"#.to_vec(),
    );
    let id = elsewhere.submit(submit).await.unwrap();
    let job = elsewhere.wait(id, GENEROUS).await.unwrap();
    assert_eq!(job.status, JobStatus::Succeeded);
    let events = client.until(|e| finished(e, &id.to_string())).await;
    let worker = elsewhere.worker_id().to_owned();
    assert!(
        events.iter().any(|e| e.kind == EventKind::WorkerJoined && e.worker.as_ref().is_some_and(|w| w.id == worker)),
        "the other process's pool registered: {events:?}"
    );
    let end = events.last().unwrap().job.as_ref().unwrap();
    assert_eq!((end.status, end.worker_id.as_deref()), (JobStatus::Succeeded, Some(worker.as_str())));
    elsewhere.shutdown().await;
}

/// The number `/metrics` reports for `name`.
async fn metric(server: &Server, name: &str) -> f64 {
    let text = server.request(reqwest::Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_while_the_others_keep_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("jobs.db"), &["--write-timeout", "1s", "--max-workers", "8"]);
    server.add_plugin("hello").await;
    let mut reader = Client::open(&server, "", None).await;
    // A client with a small receive buffer that reads its answer's head,
    // then nothing more.
    let address: std::net::SocketAddr = server.url.trim_start_matches("http://").parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&address.into()).unwrap();
    let mut stalled: std::net::TcpStream = socket.into();
    write!(stalled, "GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n", server.token).unwrap();
    let mut head = [0u8; 64];
    let n = stalled.read(&mut head).unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head[..n]));
    eventually("both clients connect", async || (metric(&server, "leash_event_clients").await == 2.0).then_some(()))
        .await;
    // Jobs until the stalled client's socket is full and the server gives
    // up on it.
    let mut jobs = Vec::new();
    while metric(&server, "leash_event_clients").await != 1.0 {
        assert!(jobs.len() < 5_000, "the stalled client was never dropped");
        for _ in 0..25 {
            jobs.push(submit_hello(&server, "x").await);
        }
    }
    // The reader got every job's whole story, in order, meanwhile.
    let last = jobs.last().unwrap().clone();
    let mut events = reader.until(|e| finished(e, &last)).await;
    for id in &jobs {
        if !events.iter().any(|e| finished(e, id)) {
            events.extend(reader.until(|e| finished(e, id)).await);
        }
    }
    assert!(events.windows(2).all(|w| w[0].id < w[1].id));
    let submitted = events.iter().filter(|e| e.kind == EventKind::JobSubmitted).count();
    assert_eq!(submitted, jobs.len(), "the reader saw every job submitted");
    // The stalled client's connection was closed: what it holds ends.
    stalled.set_read_timeout(Some(GENEROUS)).unwrap();
    let mut rest = Vec::new();
    match stalled.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let _ = dir;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_watch_prints_events_live_and_ends_with_the_job_it_watches() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("jobs.db");
    let server = Server::start(&db, &[]);
    server.add_plugin("hello").await;
    // Live, against the server: one JSON event per line.
    let mut live = leash_bin()
        .args(["jobs", "watch", "--json", "--server", &server.url, "--token-file"])
        .arg(&server.token_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(live.stdout.take().unwrap()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Jobs until the watcher (which connects in its own time) shows one's end.
    let start = Instant::now();
    let id = 'watching: loop {
        assert!(start.elapsed() < GENEROUS, "jobs watch printed no job's end");
        let id = submit_hello(&server, "w").await;
        server.poll_job(&id, crate::support::server::is_terminal).await;
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            let event: Event = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if finished(&event, &id) {
                break 'watching id;
            }
        }
    };
    let _ = live.kill();
    let _ = live.wait();
    // On the local database, from the start of the feed, one job's events:
    // it ends by itself when the job has.
    let output =
        leash_bin().args(["jobs", "watch", "--db"]).arg(&db).args(["--job", &id, "--after", "0-0"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout);
    let kinds: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap_or_default())
        .filter(|kind| *kind != "job.progress")
        .collect();
    assert_eq!(kinds, ["job.submitted", "job.started", "job.finished"], "{text}");
    assert!(text.lines().all(|l| l.contains(&id)), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_behind_retention_hears_once_that_it_missed_events_then_gets_the_new_ones() {
    use leash::runtime::StreamItem;
    use leash::store::{EventsAfterParams, JobInsertParams, JobsDeleteParams};
    let dir = tempfile::tempdir().unwrap();
    let runtime = leash::runtime::Runtime::builder(dir.path().join("jobs.db"))
        .without_workers()
        .event_poll(Duration::from_millis(10))
        .build()
        .await
        .unwrap();
    let store = runtime.store().clone();
    let insert = |input: &str| {
        let job = crate::store::conformance::cases::new_job(input);
        store.job_insert(JobInsertParams { jobs: vec![job], now: leash::clock::Timestamp::now() })
    };
    insert("a").await.unwrap();
    insert("b").await.unwrap();
    let kept = insert("c").await.unwrap().pop().unwrap();
    let old = store.events_after(EventsAfterParams { after: None, limit: 10 }).await.unwrap().events;
    // A client from now: the process's reader goes on from the newest
    // event, ahead of the one behind.
    let _live = runtime.events(None, Default::default()).await.unwrap();
    let everything = leash::clock::Timestamp::now().plus(Duration::from_secs(3600));
    store
        .jobs_delete_expired(JobsDeleteParams {
            finished_before: leash::clock::Timestamp::from_unix_ms(0),
            events_before: everything,
            audit_before: None,
        })
        .await
        .unwrap();
    let mut stream = runtime.events(Some(old[0].id), Default::default()).await.unwrap();
    let first = tokio::time::timeout(GENEROUS, stream.next()).await.expect("an item in time").unwrap();
    assert_eq!(first, StreamItem::Missed);
    // Retention keeps the newest event.
    match tokio::time::timeout(GENEROUS, stream.next()).await.expect("an item in time").unwrap() {
        StreamItem::Event(event) => assert_eq!(event.job.unwrap().id, kept.id),
        other => panic!("{other:?}"),
    }
    let new = insert("d").await.unwrap().pop().unwrap();
    match tokio::time::timeout(GENEROUS, stream.next()).await.expect("an item in time").unwrap() {
        StreamItem::Event(event) => assert_eq!(event.job.unwrap().id, new.id, "the new job, and no second gap"),
        other => panic!("{other:?}"),
    }
    runtime.shutdown().await;
}
