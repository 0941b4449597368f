//! The HTTP listener of `leash serve`: HTTP/1.1 connections, each bounded
//! in time and all bounded in number, so clients that open connections and
//! stall cannot lock everyone else out.
//!
//! - A connection has [`ListenLimits::header_timeout`] to send a request's
//!   headers, and an idle keep-alive connection is closed after the same
//!   time (hyper arms one timer whenever it waits for a request head).
//! - A write that the client leaves unread for
//!   [`ListenLimits::write_timeout`] (its socket full: it stopped reading an
//!   answer or an event stream) closes the connection.
//! - At most [`ListenLimits::max_connections`] are open at once; one over
//!   the cap is answered `503` with a JSON error and `Retry-After`, then
//!   closed, rather than left waiting in the accept queue.
//! - Accept errors (out of file descriptors) back off briefly instead of
//!   spinning.
//!
//! axum's own `serve` offers none of these settings, so connections are
//! served here with hyper directly, as axum does inside.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;

/// Default time a connection has to send a request's headers, and an idle
/// keep-alive connection stays open.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a write may wait for a client to read.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default cap on open connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
/// How long accepting pauses after an accept error (file descriptors out).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How long a refused connection gets to send its request head.
const REFUSAL_READ_TIME: Duration = Duration::from_millis(250);
/// The most of a refused connection's request that is read.
const MAX_REFUSED_HEAD_BYTES: usize = 16 << 10;

/// Connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    /// Time to send request headers; also the idle keep-alive time.
    pub header_timeout: Duration,
    /// Time a write may wait for the client to read before the connection
    /// is closed.
    pub write_timeout: Duration,
    /// Connections open at once; more are answered 503.
    pub max_connections: usize,
}

impl Default for ListenLimits {
    fn default() -> Self {
        ListenLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// The answer to a connection over the cap: the documented JSON error.
fn over_cap() -> String {
    let body = r#"{"error":{"kind":"busy","message":"too many open connections; retry in a second"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Serve `app` on `listener` until `shutdown` resolves, then stop accepting
/// and wait for the open connections; dropping the future drops them.
pub async fn serve(listener: TcpListener, app: Router, limits: ListenLimits, shutdown: impl Future<Output = ()>) {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut connections = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            // Refusals are bounded too: past as many again, close at once.
            if let Ok(refusing) = refusing.clone().try_acquire_owned() {
                connections.spawn(async move {
                    refuse(stream).await;
                    drop(refusing);
                });
            }
            continue;
        };
        // Answers go out as soon as they are written, not held back for
        // the peer's acknowledgement of an earlier segment.
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.write_timeout));
        let connection = http.serve_connection(TokioIo::new(Box::pin(stream)), service);
        connections.spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    // Accept no more (new connections are refused, not queued), but let
    // requests in progress finish: the caller drops this future, and with
    // it every connection, when its own budget ends.
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// Answer a connection over the cap: read (briefly) the request it sent, so
/// the 503 is not an unsolicited message to its client, then close.
async fn refuse(mut stream: tokio::net::TcpStream) {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    let read_head = async {
        while head.len() < MAX_REFUSED_HEAD_BYTES {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buffer[..n]),
            }
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_READ_TIME, read_head).await;
    let _ = tokio::time::timeout(REFUSAL_READ_TIME, stream.write_all(over_cap().as_bytes())).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_over_cap_answer_is_well_formed() {
        let answer = over_cap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let value: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(value["error"]["kind"], "busy");
    }
}
