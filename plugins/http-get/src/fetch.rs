//! One HTTP request through `wasi:http/outgoing-handler`, the body read as
//! it streams (counted and hashed, never held whole), every failure
//! reported by its WASI error code (`HttpRequestDenied`, ...).

use sha2::{Digest, Sha256};
use wasi::http::outgoing_handler;
use wasi::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasi::io::streams::StreamError;

/// What came back.
pub struct Fetched {
    pub status: u16,
    pub body_bytes: u64,
    pub body_sha256: String,
    /// The first KiB of the body, as text.
    pub body_start: String,
    /// The `Location` header, if the response has one.
    pub location: Option<String>,
}

/// The WASI error code's name, or what else went wrong.
fn code(e: ErrorCode) -> String {
    let debug = format!("{e:?}");
    let name = debug.strip_prefix("ErrorCode::").unwrap_or(&debug);
    name.split(['(', ' ', '{']).next().unwrap_or(name).to_owned()
}

pub fn fetch(method: &str, url: &str, headers: &[(String, String)], body: Option<&[u8]>) -> Result<Fetched, String> {
    fetch_keeping(method, url, headers, body, 1024).map(|(fetched, _)| fetched)
}

/// [`fetch`], keeping the first `keep` bytes of the body too.
pub fn fetch_keeping(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: Option<&[u8]>,
    keep: usize,
) -> Result<(Fetched, Vec<u8>), String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url:?} has no scheme"))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let fields = Fields::new();
    for (name, value) in headers {
        fields.append(name, value.as_bytes()).map_err(|e| format!("header {name}: {e:?}"))?;
    }
    let request = OutgoingRequest::new(fields);
    let method = match method.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_owned()),
    };
    request.set_method(&method).map_err(|()| "invalid method".to_owned())?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_owned()),
    };
    request.set_scheme(Some(&scheme)).map_err(|()| "invalid scheme".to_owned())?;
    request.set_authority(Some(authority)).map_err(|()| "invalid authority".to_owned())?;
    request.set_path_with_query(Some(path)).map_err(|()| "invalid path".to_owned())?;
    let outgoing = request.body().map_err(|()| "no request body".to_owned())?;
    let pending = outgoing_handler::handle(request, None).map_err(code)?;
    {
        let stream = outgoing.write().map_err(|()| "no request body stream".to_owned())?;
        for chunk in body.unwrap_or_default().chunks(4096) {
            if let Err(e) = stream.blocking_write_and_flush(chunk) {
                // The host refused the body (over its limit); the
                // response says why.
                let _ = e;
                break;
            }
        }
    }
    let _ = OutgoingBody::finish(outgoing, None);
    pending.subscribe().block();
    let response =
        pending.get().ok_or("no response")?.map_err(|()| "response taken twice".to_owned())?.map_err(code)?;
    let status = response.status();
    let location = response.headers().get("location").first().map(|v| String::from_utf8_lossy(v).into_owned());
    let incoming = response.consume().map_err(|()| "no response body".to_owned())?;
    let stream = incoming.stream().map_err(|()| "no response body stream".to_owned())?;
    let (mut body_bytes, mut hash, mut kept) = (0u64, Sha256::new(), Vec::new());
    loop {
        match stream.blocking_read(64 << 10) {
            Ok(chunk) => {
                body_bytes += chunk.len() as u64;
                hash.update(&chunk);
                let room = keep.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(wasi::http::types::http_error_code(&e).map_or_else(|| e.to_debug_string(), code));
            }
        }
    }
    let body_sha256 = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let body_start = String::from_utf8_lossy(&kept[..kept.len().min(1024)]).into_owned();
    Ok((Fetched { status, body_bytes, body_sha256, body_start, location }, kept))
}
