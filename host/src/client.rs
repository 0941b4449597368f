//! The operator CLI's view of leash: the HTTP API, spoken either to a
//! server over the network or to an in-process router on a local database.
//! Both go through [`crate::api::router`], so a command behaves the same
//! against `leash serve` and against a database file.

use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use tower::ServiceExt;

use crate::api::types::ErrorBody;
use crate::api::{ApiConfig, router};
use crate::runtime::Runtime;

/// Tries of a create request ([`Client::create`]) before giving up.
const CREATE_TRIES: u32 = 4;
/// The first wait between tries; it doubles after each.
const CREATE_RETRY_DELAY: Duration = Duration::from_millis(250);

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{message} ({status}, {kind})")]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The error kind from the body.
        kind: String,
        /// The message from the body.
        message: String,
    },
    /// The server could not be reached.
    #[error("cannot reach {url}: {detail}")]
    Unreachable {
        /// The server.
        url: String,
        /// What went wrong.
        detail: String,
    },
    /// The answer was not what the API promises.
    #[error("unexpected answer: {0}")]
    Protocol(String),
}

enum Transport {
    Http { base: String, token: String, http: reqwest::Client },
    Local { router: axum::Router, token: String },
}

/// A connection to leash: remote (`--server`) or a local database.
pub struct Client {
    transport: Transport,
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.transport {
            Transport::Http { base, .. } => write!(f, "Client({base})"),
            Transport::Local { .. } => f.write_str("Client(local)"),
        }
    }
}

/// An answer's body as it arrives.
pub type BodyStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, ClientError>> + Send>>;

/// An answer: status and body bytes.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: StatusCode,
    /// Body.
    pub body: Bytes,
}

impl Client {
    /// A client for the server at `base` (e.g. `http://127.0.0.1:7070`).
    pub fn remote(base: &str, token: String) -> Result<Self, ClientError> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Unreachable {
                url: base,
                detail: "the server URL must start with http://".into(),
            });
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| ClientError::Unreachable { url: base.clone(), detail: e.to_string() })?;
        Ok(Client { transport: Transport::Http { base, token, http }, runtime: None })
    }

    /// A client on a local runtime: requests are served in process.
    pub fn local(runtime: Runtime) -> Self {
        let token = random_token();
        let config =
            ApiConfig { token: token.clone(), sync_ceiling: Duration::from_secs(60), max_body_bytes: usize::MAX };
        let router = router(runtime.clone(), config);
        Client { transport: Transport::Local { router, token }, runtime: Some(runtime) }
    }

    /// [`Client::local`], acting as the principal whose `token` this is
    /// (authenticated and role-checked as the server would) rather than as
    /// the bootstrap admin.
    pub fn local_as(runtime: Runtime, token: String) -> Self {
        let mut client = Client::local(runtime);
        if let Transport::Local { token: sent, .. } = &mut client.transport {
            *sent = token;
        }
        client
    }

    /// The local runtime, if this client has one.
    pub fn runtime(&self) -> Option<&Runtime> {
        self.runtime.as_ref()
    }

    /// Where requests go, for messages.
    pub fn target(&self) -> String {
        match &self.transport {
            Transport::Http { base, .. } => base.clone(),
            Transport::Local { .. } => "the local database".into(),
        }
    }

    /// Send a request; any status comes back as an [`Answer`].
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &'static str)>,
    ) -> Result<Answer, ClientError> {
        self.send_with(method, path, body, &[]).await
    }

    /// [`Client::send`] with extra request headers.
    async fn send_with(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &'static str)>,
        headers: &[(&'static str, String)],
    ) -> Result<Answer, ClientError> {
        match &self.transport {
            Transport::Http { base, token, http } => {
                let url = format!("{base}{path}");
                let mut request = http.request(method, &url).bearer_auth(token);
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                if let Some((bytes, content_type)) = body {
                    request = request.header(header::CONTENT_TYPE, content_type).body(bytes);
                }
                let unreachable =
                    |e: reqwest::Error| ClientError::Unreachable { url: base.clone(), detail: e.to_string() };
                let response = request.send().await.map_err(unreachable)?;
                let status = response.status();
                let body = response.bytes().await.map_err(unreachable)?;
                Ok(Answer { status, body })
            }
            Transport::Local { router, token } => {
                let mut request = Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::AUTHORIZATION, format!("Bearer {token}"));
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                let body = match body {
                    Some((bytes, content_type)) => {
                        request = request.header(header::CONTENT_TYPE, content_type);
                        Body::from(bytes)
                    }
                    None => Body::empty(),
                };
                let request = request.body(body).map_err(|e| ClientError::Protocol(e.to_string()))?;
                let response = router.clone().oneshot(request).await.map_err(|e| match e {})?;
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                Ok(Answer { status, body })
            }
        }
    }

    /// Open a `GET` whose answer is read as it arrives (an event stream):
    /// an error status becomes [`ClientError::Api`].
    pub async fn open_stream(&self, path: &str, headers: &[(&'static str, String)]) -> Result<BodyStream, ClientError> {
        let (status, body): (StatusCode, BodyStream) = match &self.transport {
            Transport::Http { base, token, http } => {
                let mut request = http.get(format!("{base}{path}")).bearer_auth(token);
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                let base = base.clone();
                let unreachable =
                    move |e: reqwest::Error| ClientError::Unreachable { url: base.clone(), detail: e.to_string() };
                let response = request.send().await.map_err(&unreachable)?;
                (response.status(), Box::pin(response.bytes_stream().map(move |chunk| chunk.map_err(&unreachable))))
            }
            Transport::Local { router, token } => {
                let mut request = Request::builder().uri(path).header(header::AUTHORIZATION, format!("Bearer {token}"));
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                let request = request.body(Body::empty()).map_err(|e| ClientError::Protocol(e.to_string()))?;
                let response = router.clone().oneshot(request).await.map_err(|e| match e {})?;
                let status = response.status();
                let chunks = response.into_body().into_data_stream();
                (status, Box::pin(chunks.map(|chunk| chunk.map_err(|e| ClientError::Protocol(e.to_string())))))
            }
        };
        if status.is_success() {
            return Ok(body);
        }
        let mut bytes = Vec::new();
        let mut body = body;
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk?);
        }
        answer_json(&Answer { status, body: bytes.into() })?;
        Err(ClientError::Protocol(format!("{status} without an error body")))
    }

    /// Send a request and read a JSON answer; an error status becomes
    /// [`ClientError::Api`].
    pub async fn json(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, ClientError> {
        let body = body.map(|v| (v.to_string().into_bytes(), "application/json"));
        answer_json(&self.send(method, path, body).await?)
    }

    /// `POST` with one of the API's request types as its body, or with
    /// none, and read a JSON answer.
    pub async fn post(&self, path: &str, body: Option<&impl serde::Serialize>) -> Result<Value, ClientError> {
        let body = body.map(request_bytes).transpose()?.map(|bytes| (bytes, "application/json"));
        answer_json(&self.send(Method::POST, path, body).await?)
    }

    /// Send one of the API's request types (`crate::api::requests`, or
    /// a type the API reads as its body) and read a JSON answer.
    pub async fn send_json(
        &self,
        method: Method,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<Value, ClientError> {
        answer_json(&self.send(method, path, Some((request_bytes(body)?, "application/json"))).await?)
    }

    /// Create something with a JSON body under a fresh idempotency key,
    /// retrying while the server cannot be reached or is busy: a retry of
    /// a request whose answer was lost returns what the first one created
    /// instead of creating it twice.
    pub async fn create(&self, path: &str, body: &impl serde::Serialize) -> Result<Value, ClientError> {
        let mut key = [0u8; 16];
        getrandom::fill(&mut key).map_err(|e| ClientError::Protocol(format!("no random source: {e}")))?;
        let headers = [(crate::api::IDEMPOTENCY_KEY, format!("leash-{}", hex::encode(key)))];
        let bytes = request_bytes(body)?;
        let mut delay = CREATE_RETRY_DELAY;
        for tries_left in (0..CREATE_TRIES).rev() {
            let answer = self.send_with(Method::POST, path, Some((bytes.clone(), "application/json")), &headers).await;
            let retry = match &answer {
                Err(ClientError::Unreachable { .. }) => true,
                Ok(a) => a.status == StatusCode::SERVICE_UNAVAILABLE,
                Err(_) => false,
            };
            if !retry || tries_left == 0 {
                return answer_json(&answer?);
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        unreachable!("the last try returns")
    }

    /// Send a request with no body whose success has none (`204`); an
    /// error status becomes [`ClientError::Api`].
    pub async fn act(&self, method: Method, path: &str) -> Result<(), ClientError> {
        let answer = self.send(method, path, None).await?;
        if answer.status.is_success() {
            return Ok(());
        }
        answer_json(&answer).map(|_| ())
    }

    /// Upload bytes and read a JSON answer.
    pub async fn upload(&self, path: &str, bytes: Vec<u8>) -> Result<Value, ClientError> {
        answer_json(&self.send(Method::POST, path, Some((bytes, "application/wasm"))).await?)
    }

    /// Stop the local runtime, if any.
    pub async fn close(&self) {
        if let Some(runtime) = &self.runtime {
            runtime.shutdown().await;
        }
    }
}

/// The JSON body of a success, or the API error it reports.
pub fn answer_json(answer: &Answer) -> Result<Value, ClientError> {
    let value: Value = serde_json::from_slice(&answer.body).map_err(|_| {
        let text = String::from_utf8_lossy(&answer.body);
        ClientError::Protocol(format!("{}: {}", answer.status, text.chars().take(200).collect::<String>()))
    })?;
    if answer.status.is_success() {
        return Ok(value);
    }
    let (kind, message) = match serde_json::from_value::<ErrorBody>(value) {
        Ok(ErrorBody { error }) => (error.kind, error.message),
        Err(_) => ("unknown".to_owned(), "no message".to_owned()),
    };
    Err(ClientError::Api { status: answer.status, kind, message })
}

/// A JSON answer read as the API type it promises ([`crate::api::types`]).
pub fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ClientError> {
    serde_json::from_value(value).map_err(|e| ClientError::Protocol(format!("the answer does not match the API: {e}")))
}

/// A fresh API token: 32 random bytes as hex.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    hex::encode(bytes)
}

/// Read a token file, refusing one that others can read.
pub fn read_token_file(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "token file {} is readable by others (mode {mode:o}); run `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    let token = std::fs::read_to_string(path).map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}

/// Read the token file, or create it (mode 0600) with a fresh token.
/// Returns the token and whether it was created.
pub fn ensure_token_file(path: &Path) -> Result<(String, bool), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut file) => {
            let token = random_token();
            file.write_all(format!("{token}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write token file {}: {e}", path.display()))?;
            Ok((token, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok((read_token_file(path)?, false)),
        Err(e) => Err(format!("cannot create token file {}: {e}", path.display())),
    }
}

/// A request body as JSON bytes.
fn request_bytes(body: &impl serde::Serialize) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(body).map_err(|e| ClientError::Protocol(format!("cannot encode the request: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_token_file_is_created_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leash.db.token");
        let (token, created) = ensure_token_file(&path).unwrap();
        assert!(created && token.len() == 64);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(ensure_token_file(&path).unwrap(), (token, false));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(ensure_token_file(&path).unwrap_err().contains("readable by others"));
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
    }
}
