//! One runtime and router for every input: an in-process `leash serve`
//! without workers, on a temporary database.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use leash::api::{ApiConfig, router};
use leash::runtime::Runtime;
use tower::ServiceExt;

pub struct Harness {
    pub tokio: tokio::runtime::Runtime,
    pub app: axum::Router,
    _dir: tempfile::TempDir,
}

pub fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio.block_on(Runtime::builder(dir.path().join("fuzz.db")).without_workers().build()).unwrap();
        let hello =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/target/wasm32-wasip2/release/hello.wasm"));
        if let Ok(bytes) = hello {
            let name = leash::job::PluginName::new("hello", "1.0.0").unwrap();
            tokio.block_on(runtime.plugin_register(bytes, name)).unwrap();
        }
        // Sync submits answer 202 at once: nothing runs here.
        let config = ApiConfig { token: "t".into(), sync_ceiling: Duration::ZERO, max_body_bytes: 1 << 20 };
        Harness { app: router(runtime, config), tokio, _dir: dir }
    })
}

/// Send `body` to `path`; the answer must be a success or a 4xx with a JSON
/// error body — never a 5xx, never a panic. Returns a success's body.
pub fn call(method: Method, path: &str, body: &[u8]) -> Option<serde_json::Value> {
    let h = harness();
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", "Bearer t")
        .body(Body::from(body.to_vec()))
        .unwrap();
    let response = h.tokio.block_on(h.app.clone().oneshot(request)).unwrap();
    let status = response.status();
    let bytes = h.tokio.block_on(axum::body::to_bytes(response.into_body(), usize::MAX)).unwrap();
    assert!(!status.is_server_error(), "{path}: {status}: {}", String::from_utf8_lossy(&bytes));
    if status.is_client_error() {
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("an error body is JSON");
        assert!(value["error"]["kind"].is_string() && value["error"]["message"].is_string(), "{value}");
        return None;
    }
    serde_json::from_slice(&bytes).ok()
}

/// POST `body` to `path` (see [`call`]). A job it queued must then read
/// back, alone and in a list page: no stored value may break a read.
pub fn post(path: &str, body: &[u8]) {
    let answer = call(Method::POST, path, body);
    if let Some(id) = answer.as_ref().and_then(|a| a["job_id"].as_str()) {
        let job = call(Method::GET, &format!("/v1/jobs/{id}"), b"").expect("a queued job reads back");
        assert_eq!(job["id"], id);
        call(Method::GET, &format!("/v1/jobs?limit=1&before={}", next_id(id)), b"").expect("a list page reads back");
    }
}

/// An id just after `id`, so a page `before` it starts with `id`.
fn next_id(id: &str) -> String {
    let mut chars: Vec<char> = id.chars().collect();
    let alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    for c in chars.iter_mut().rev() {
        let i = alphabet.find(*c).unwrap();
        if i + 1 < alphabet.len() {
            *c = alphabet.as_bytes()[i + 1] as char;
            return chars.into_iter().collect();
        }
        *c = '0';
    }
    chars.into_iter().collect()
}
