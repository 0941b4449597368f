//! Outbound HTTP through `wasi:http/outgoing-handler`, the same helpers
//! the Python (`leash.http`) and JavaScript (`leash.http`) SDKs offer.
//!
//! The host sends a request only if the job's grant allows it: run with
//! `leash run --allow-host 'GET https://api.example.com' plugin.wasm`, or
//! grant it on `leash plugins add`. A header value may name a secret,
//! `{secret:NAME}`; the host puts in its value when the grant lets the
//! request carry it, and the plugin never sees it.
//!
//! ```no_run
//! use leash_sdk::http;
//!
//! # fn run() -> Result<(), leash_sdk::Error> {
//! let todo: serde_json::Value = http::get("https://api.example.com/todos/1")?.json()?;
//! let created = http::Request::post("https://api.example.com/todos")
//!     .header("authorization", "Bearer {secret:API_TOKEN}")
//!     .json(&todo)?
//!     .timeout(std::time::Duration::from_secs(10))
//!     .send()?;
//! if created.status >= 500 {
//!     return Err(leash_sdk::Error::retryable(format!("the upstream answered {}", created.status)));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A response with an error status is a [`Response`]; only a request that
//! got no response is an [`HttpError`]. With `?` in a plugin's `run`, an
//! `HttpError` becomes [`Error::Retryable`] when the same request may
//! succeed later (a refused connection, a timeout) and [`Error::Failed`]
//! otherwise (a request the grant does not allow).

use std::fmt;
use std::time::Duration;

use crate::Error;
use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    ErrorCode, Fields, HeaderError, IncomingBody, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use crate::bindings::wasi::io::streams::StreamError;

/// Errors after which the same request may well succeed later.
const RETRYABLE_CODES: &[&str] = &[
    "DNS-timeout",
    "DNS-error",
    "destination-unavailable",
    "connection-refused",
    "connection-terminated",
    "connection-timeout",
    "connection-read-timeout",
    "connection-write-timeout",
    "connection-limit-reached",
    "HTTP-response-incomplete",
    "HTTP-response-timeout",
];

/// A request that got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// The request's method.
    pub method: String,
    /// The request's URL.
    pub url: String,
    /// The `wasi:http` error code's WIT name: `HTTP-request-denied` (the
    /// job's grant does not allow the request; the job's logs name the
    /// `--allow-host` rule that would), `connection-refused`,
    /// `HTTP-response-timeout`, ...; for a header the request may not
    /// carry, wasi:http's header error: `forbidden` (`connection`, `host`
    /// and the other hop-by-hop headers), `invalid-syntax`.
    pub code: String,
    /// What else the host said, if anything.
    pub detail: Option<String>,
}

impl HttpError {
    /// Whether the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        RETRYABLE_CODES.contains(&self.code.as_str())
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.method, self.url, self.code)?;
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        if self.code == "HTTP-request-denied" {
            f.write_str(" (not granted to this job; its logs name the --allow-host rule that grants it)")?;
        }
        Ok(())
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for Error {
    fn from(e: HttpError) -> Self {
        if e.is_retryable() { Error::retryable(e) } else { Error::failed(e) }
    }
}

/// What came back: the status, the headers (names lowercase, in the order
/// received) and the whole body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// True for a 2xx status.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of a header, or `None`.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }

    /// The body as UTF-8 (undecodable bytes replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body decoded as JSON; [`Error::Failed`] if it is not the JSON
    /// expected.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.body).map_err(|e| {
            let start: String = self.text().chars().take(200).collect();
            Error::failed(format!("the response ({}) is not the JSON expected: {e}: {start:?}", self.status))
        })
    }
}

/// One request to send: a method, a URL, headers, a body and a timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
}

impl Request {
    /// A request with this method (any case) and URL (`http://` or
    /// `https://`).
    pub fn new(method: &str, url: &str) -> Request {
        Request {
            method: method.to_ascii_uppercase(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
        }
    }

    /// A GET.
    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }

    /// A POST.
    pub fn post(url: &str) -> Request {
        Request::new("POST", url)
    }

    /// Add a header (a value may be `{secret:NAME}`).
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Set the body to `value` as JSON, with `content-type:
    /// application/json` unless a content type is set.
    pub fn json<T: serde::Serialize + ?Sized>(mut self, value: &T) -> Result<Request, Error> {
        self.body = serde_json::to_vec(value).map_err(|e| Error::failed(format!("cannot encode the body: {e}")))?;
        if !self.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-type")) {
            self.headers.push(("content-type".to_owned(), "application/json".to_owned()));
        }
        Ok(self)
    }

    /// Bound the connect, the wait for the first response byte and each
    /// wait between body bytes (the job's deadline bounds it all).
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }

    /// Its method.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its headers, in order.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Its body.
    pub fn body_bytes(&self) -> &[u8] {
        &self.body
    }

    /// Send it and read the whole response.
    pub fn send(self) -> Result<Response, HttpError> {
        let fail = |code: String, detail: Option<String>| HttpError {
            method: self.method.clone(),
            url: self.url.clone(),
            code,
            detail,
        };
        let failed = |e: ErrorCode| {
            let (code, detail) = code_name(&e);
            fail(code, detail)
        };
        let invalid = |what: &str| fail("HTTP-request-URI-invalid".to_owned(), Some(what.to_owned()));
        let (scheme, rest) = self.url.split_once("://").ok_or_else(|| invalid("the URL has no scheme"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(invalid("not an http:// or https:// URL")),
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        let fields = Fields::new();
        for (name, value) in &self.headers {
            // A header the host will not send (`connection`, `host`, …) or
            // one that is not valid: named by wasi:http's header-error.
            fields.append(name, value.as_bytes()).map_err(|e| {
                let code = match e {
                    HeaderError::InvalidSyntax => "invalid-syntax",
                    HeaderError::Forbidden => "forbidden",
                    HeaderError::Immutable => "immutable",
                };
                fail(code.to_owned(), Some(format!("header {name}")))
            })?;
        }
        let request = OutgoingRequest::new(fields);
        let method = match self.method.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "OPTIONS" => Method::Options,
            other => Method::Other(other.to_owned()),
        };
        request.set_method(&method).map_err(|()| fail("HTTP-request-method-invalid".to_owned(), None))?;
        request.set_scheme(Some(&scheme)).map_err(|()| invalid("invalid scheme"))?;
        request.set_authority(Some(authority)).map_err(|()| invalid("invalid host"))?;
        request.set_path_with_query(Some(&path)).map_err(|()| invalid("invalid path"))?;
        let options = self.timeout.map(|t| {
            let nanos = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX);
            let options = RequestOptions::new();
            let _ = options.set_connect_timeout(Some(nanos));
            let _ = options.set_first_byte_timeout(Some(nanos));
            let _ = options.set_between_bytes_timeout(Some(nanos));
            options
        });
        let outgoing =
            request.body().map_err(|()| fail("internal-error".to_owned(), Some("no request body".into())))?;
        let pending = outgoing_handler::handle(request, options).map_err(failed)?;
        // Each resource is dropped before the one it came from.
        if let Ok(stream) = outgoing.write() {
            for chunk in self.body.chunks(4096) {
                if stream.blocking_write_and_flush(chunk).is_err() {
                    break; // the host refused the body; the response says why
                }
            }
        }
        let _ = OutgoingBody::finish(outgoing, None);
        pending.subscribe().block();
        let no_response = || fail("internal-error".to_owned(), Some("no response".to_owned()));
        let response = pending.get().ok_or_else(no_response)?.map_err(|()| no_response())?.map_err(failed)?;
        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), String::from_utf8_lossy(&v).into_owned()))
            .collect();
        let incoming = response.consume().map_err(|()| no_response())?;
        let mut body = Vec::new();
        {
            let stream = incoming.stream().map_err(|()| no_response())?;
            loop {
                match stream.blocking_read(64 << 10) {
                    Ok(chunk) => body.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        return Err(crate::bindings::wasi::http::types::http_error_code(&e).map_or_else(
                            || fail("HTTP-protocol-error".to_owned(), Some(e.to_debug_string())),
                            failed,
                        ));
                    }
                }
            }
        }
        drop(IncomingBody::finish(incoming));
        Ok(Response { status, headers, body })
    }
}

/// GET `url`. (Like [`post_json`], its error is the plugin's
/// [`Error`], ready for `?`; [`Request::send`] gives the
/// [`HttpError`] itself.)
pub fn get(url: &str) -> Result<Response, Error> {
    Ok(Request::get(url).send()?)
}

/// POST `value` as JSON to `url`.
pub fn post_json<T: serde::Serialize + ?Sized>(url: &str, value: &T) -> Result<Response, Error> {
    Ok(Request::post(url).json(value)?.send()?)
}

/// A `wasi:http` error code as its WIT name (`HTTP-request-denied`), and
/// its detail when it carries text.
fn code_name(code: &ErrorCode) -> (String, Option<String>) {
    let debug = format!("{code:?}");
    let variant = debug.strip_prefix("ErrorCode::").unwrap_or(&debug);
    let variant = variant.split(['(', ' ', '{']).next().unwrap_or(variant);
    let mut words: Vec<String> = Vec::new();
    for c in variant.chars() {
        match words.last_mut() {
            Some(word) if !c.is_ascii_uppercase() => word.push(c),
            _ => words.push(c.to_string()),
        }
    }
    let name = words
        .iter()
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            if ["dns", "tls", "http", "ip", "uri"].contains(&lower.as_str()) { w.to_ascii_uppercase() } else { lower }
        })
        .collect::<Vec<_>>()
        .join("-");
    let detail = match code {
        ErrorCode::InternalError(detail) => detail.clone(),
        ErrorCode::DnsError(payload) => payload.rcode.clone(),
        _ => None,
    };
    (name, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_read_as_their_wit_names() {
        let cases = [
            (ErrorCode::HttpRequestDenied, "HTTP-request-denied"),
            (ErrorCode::DnsTimeout, "DNS-timeout"),
            (ErrorCode::DestinationIpProhibited, "destination-IP-prohibited"),
            (ErrorCode::ConnectionRefused, "connection-refused"),
            (ErrorCode::HttpRequestUriInvalid, "HTTP-request-URI-invalid"),
            (ErrorCode::InternalError(Some("boom".into())), "internal-error"),
        ];
        for (code, name) in cases {
            assert_eq!(code_name(&code).0, name);
        }
        assert_eq!(code_name(&ErrorCode::InternalError(Some("boom".into()))).1.as_deref(), Some("boom"));
    }

    #[test]
    fn transport_failures_retry_and_denials_do_not() {
        let error =
            |code: &str| HttpError { method: "GET".into(), url: "http://x/".into(), code: code.into(), detail: None };
        assert!(matches!(Error::from(error("connection-refused")), Error::Retryable(_)));
        assert!(matches!(Error::from(error("HTTP-response-timeout")), Error::Retryable(_)));
        let denied = Error::from(error("HTTP-request-denied"));
        assert!(matches!(&denied, Error::Failed(m) if m.contains("--allow-host")), "{denied}");
    }

    #[test]
    fn a_response_reads_as_text_json_and_headers() {
        let response = Response {
            status: 503,
            headers: vec![("content-type".into(), "application/json".into())],
            body: br#"{"a":1}"#.to_vec(),
        };
        assert!(!response.ok());
        assert_eq!(response.header("Content-Type"), Some("application/json"));
        assert_eq!(response.json::<serde_json::Value>().unwrap()["a"], 1);
        let not_json = Response { body: b"<html>".to_vec(), ..response };
        assert!(matches!(not_json.json::<serde_json::Value>(), Err(Error::Failed(m)) if m.contains("(503)")));
    }

    #[test]
    fn a_json_body_sets_its_content_type_unless_one_is_set() {
        let request = Request::post("http://x/").json(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(request.headers, [("content-type".to_owned(), "application/json".to_owned())]);
        let typed = Request::post("http://x/").header("Content-Type", "text/json").json(&1).unwrap();
        assert_eq!(typed.headers.len(), 1);
    }
}
