//! Sending one admitted request: resolve on the host, connect only to an
//! allowed address, TLS by the name the guest asked for, HTTP/1.1, bodies
//! capped both ways, all of it by the request's time limit.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody};

use super::pace::{EgressLimits, Pace, RateTrip};
use super::{EffectOutcome, HTTP_LOG_FIELD, HttpMeter, HttpScheme, Journal, Target, withdrawn};
use crate::job::Grants;
use crate::job::grant::{normal_host, parse_ip_host};
use crate::job::rate::Outbound;
use crate::sandbox::journal::LogLevel;

/// The TLS client every request shares: the webpki roots, no client
/// certificate.
static TLS: LazyLock<tokio_rustls::TlsConnector> = LazyLock::new(|| {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.into() };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
});

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

pub(super) async fn send(
    mut target: Target,
    request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    grants: Arc<Grants>,
    (egress, trip): (Option<Arc<dyn EgressLimits>>, Arc<RateTrip>),
    journal: Journal,
    meter: Arc<HttpMeter>,
) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
    let grant = &grants.http;
    if let Some(egress) = egress {
        paced(&mut target, &*egress, &trip, grant.limits.request_timeout, &journal, &meter).await?;
    }
    // An apply phase's effect is matched to an approved proposal, body and
    // all, before anything is resolved or connected.
    let (request, proposal) = match &target.approved {
        None => (request, None),
        Some(approved) => {
            let (parts, body) = request.into_parts();
            let limit = grant.limits.request_bytes;
            let body =
                Capped::new(body, limit, Some(target.until), Error::HttpRequestBodySize).collect().await?.to_bytes();
            let digest = crate::job::Digest::of(&body);
            match approved.effects.claim(&target.method, &approved.url, &approved.headers, &digest) {
                Some(n) => {
                    let body = http_body_util::Full::new(body).map_err(|never| match never {}).boxed_unsync();
                    (http::Request::from_parts(parts, body), Some((approved.effects.clone(), n)))
                }
                None => {
                    let why = "not an approved proposal: an apply phase sends only what its plan proposed and \
                               a person approved, exactly (method, URL, headers, body), each once";
                    withdrawn(&journal, &meter, &target.shown(), &why);
                    return Err(Error::HttpRequestDenied);
                }
            }
        }
    };
    let sent =
        send_checked(&target, request, proposal.as_ref().map(|(_, n)| *n), options, grant, &journal, &meter).await;
    if let Some((effects, n)) = proposal {
        effects.settle(n, sent.is_ok());
    }
    sent
}

/// Wait for the request's rate slot under the limits that apply to it.
/// A slot past the deadline trips the run's end, and the request waits
/// for that end rather than failing into a guest that could carry on.
async fn paced(
    target: &mut Target,
    egress: &dyn EgressLimits,
    trip: &RateTrip,
    request_timeout: std::time::Duration,
    journal: &Journal,
    meter: &HttpMeter,
) -> Result<(), Error> {
    let host = normal_host(&target.host);
    let outbound = Outbound {
        method: &target.method,
        scheme: target.scheme,
        host: &host,
        port: target.port,
        secrets: &target.secrets,
    };
    let left = target.deadline.saturating_duration_since(Instant::now());
    match egress.pace(&outbound, left).await {
        Ok(Pace::Now) => Ok(()),
        Ok(Pace::After(wait, limits)) => {
            if !trip.wait_logged.swap(true, std::sync::atomic::Ordering::Relaxed) {
                journal.record(
                    LogLevel::Info,
                    format!(
                        "HTTP request {} waits {:.3} s for its slot under rate limit {} (later waits are not logged)",
                        target.shown(),
                        wait.as_secs_f64(),
                        limits.join(", ")
                    ),
                    vec![(HTTP_LOG_FIELD.to_owned(), "rate_wait".to_owned())],
                );
            }
            tokio::time::sleep(wait).await;
            // The request's own time limit runs from when it leaves.
            target.until = (Instant::now() + request_timeout).min(target.deadline);
            // An attempt that began stopping while it waited makes no new effect.
            if let Some(why) = target.ledger.as_ref().and_then(|ledger| ledger.refusing()) {
                withdrawn(journal, meter, &target.shown(), &format!("no new effects: {why}"));
                return Err(Error::HttpRequestDenied);
            }
            Ok(())
        }
        Ok(Pace::TooLate(after, limits)) => {
            let why = format!(
                "rate limit {} gives it a slot in {:.1} s, after the job's deadline",
                limits.join(", "),
                after.as_secs_f64()
            );
            withdrawn(journal, meter, &target.shown(), &why);
            trip.trip(after, &limits, &target.shown());
            std::future::pending().await
        }
        Err(why) => {
            withdrawn(journal, meter, &target.shown(), &format!("no rate slot could be given: {why}"));
            Err(Error::HttpRequestDenied)
        }
    }
}

/// Send a request the fence let through: resolve, connect, record the
/// intent, send.
async fn send_checked(
    target: &Target,
    request: http::Request<WasiBody>,
    proposal: Option<u32>,
    options: Option<RequestOptions>,
    grant: &crate::job::grant::HttpGrant,
    journal: &Journal,
    meter: &HttpMeter,
) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
    let addrs = resolve(target).await?;
    let allowed: Vec<SocketAddr> =
        addrs.iter().copied().filter(|a| grant.address_allowed(&target.host, a.ip())).collect();
    if allowed.is_empty() {
        let listed = addrs.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ");
        let why = format!(
            "{} resolves to {listed}, a private address no range is granted for; grant it with \
             --allow-private {} (or name the address itself in --allow-host)",
            target.host,
            addrs.first().map(|a| a.ip().to_string()).unwrap_or_default()
        );
        withdrawn(journal, meter, &target.shown(), &why);
        return Err(Error::DestinationIpProhibited);
    }
    // Connect before the intent is recorded, so that little but the write
    // itself lies between the two.
    let deadline =
        |limit: Option<std::time::Duration>| limit.map_or(target.until, |d| (Instant::now() + d).min(target.until));
    let (sender, conn) = open(target, &allowed, deadline(options.and_then(|o| o.connect_timeout))).await?;
    // An effect is made only once the ledger has recorded its intent,
    // which it does only while the attempt may still act.
    let ticket = match &target.ledger {
        None => None,
        Some(ledger) => match ledger.begin(&target.method, &target.url, proposal).await {
            Ok(ticket) => Some((ledger.clone(), ticket)),
            Err(why) => {
                withdrawn(journal, meter, &target.shown(), &format!("no new effects: {why}"));
                return Err(Error::HttpRequestDenied);
            }
        },
    };
    let mut request = request;
    if let Some((ledger, ticket)) = &ticket {
        let key = http::HeaderValue::from_str(&ticket.idempotency_key).map_err(|_| Error::HttpRequestDenied)?;
        request.headers_mut().insert("idempotency-key", key);
        // A process paused since the intent was recorded may have lost its
        // lease meanwhile: by the local clock, send only inside it, or once
        // the store has confirmed the lease again.
        if ticket.lease_until.is_some_and(|until| Instant::now() >= until)
            && let Err(why) = ledger.reconfirm().await
        {
            ledger.end(ticket, EffectOutcome::Error(format!("not sent: {why}"))).await;
            withdrawn(journal, meter, &target.shown(), &format!("no new effects: {why}"));
            return Err(Error::HttpRequestDenied);
        }
    }
    let first_byte_by = deadline(options.and_then(|o| o.first_byte_timeout));
    let sent = exchange(target, sender, conn, request, first_byte_by, &grant.limits).await;
    if let Some((ledger, ticket)) = &ticket {
        let outcome = match &sent {
            Ok((response, _)) => EffectOutcome::Status(response.status().as_u16()),
            Err(e) => EffectOutcome::Error(e.to_string()),
        };
        ledger.end(ticket, outcome).await;
    }
    sent
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::combinators::UnsyncBoxBody<Bytes, Error>>;
type Connection = hyper::client::conn::http1::Connection<
    TokioIo<Box<dyn Io>>,
    http_body_util::combinators::UnsyncBoxBody<Bytes, Error>,
>;

/// Connect to the first of `allowed` that answers, with TLS for `https`,
/// and open an HTTP/1.1 connection, all by `connect_by`.
async fn open(target: &Target, allowed: &[SocketAddr], connect_by: Instant) -> Result<(Sender, Connection), Error> {
    let stream = connect(allowed, connect_by).await?;
    let io: Box<dyn Io> = match target.scheme {
        HttpScheme::Http => Box::new(stream),
        HttpScheme::Https => {
            let name = match parse_ip_host(&target.host) {
                Some(ip) => rustls::pki_types::ServerName::IpAddress(ip.into()),
                None => rustls::pki_types::ServerName::try_from(target.host.clone())?,
            };
            let tls = tokio::time::timeout_at(connect_by.into(), TLS.connect(name, stream))
                .await
                .map_err(|_| Error::ConnectionTimeout)?
                .map_err(Error::Tls)?;
            Box::new(tls)
        }
    };
    tokio::time::timeout_at(connect_by.into(), hyper::client::conn::http1::Builder::new().handshake(TokioIo::new(io)))
        .await
        .map_err(|_| Error::ConnectionTimeout)?
        .map_err(Error::from)
}

/// Send `request` on the open connection and wait for the response head
/// (by `first_byte_by`).
async fn exchange(
    target: &Target,
    mut sender: Sender,
    conn: Connection,
    request: http::Request<WasiBody>,
    first_byte_by: Instant,
    limits: &crate::job::grant::HttpLimits,
) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
    let (max_request, max_response) = (limits.request_bytes, limits.response_bytes);
    let until = target.until;
    // On the wire the request line carries the path only.
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = http::Uri::builder().path_and_query(path).build().map_err(|_| Error::HttpRequestUriInvalid)?;
    let body = Capped::new(body, max_request, None, Error::HttpRequestBodySize);
    let request = http::Request::from_parts(parts, body.boxed_unsync());

    // Drive the connection while waiting for the response head; a server
    // that answers and closes may finish the connection first.
    let mut conn = Some(Box::pin(conn));
    let response = tokio::time::timeout_at(first_byte_by.into(), async {
        let mut send = std::pin::pin!(sender.send_request(request));
        if let Some(driving) = conn.as_mut() {
            tokio::select! {
                biased;
                response = &mut send => return response.map_err(Error::from),
                ended = driving => {
                    conn = None;
                    ended?;
                }
            }
        }
        send.await.map_err(Error::from)
    })
    .await
    .map_err(|_| Error::HttpResponseTimeout)??;
    drop(sender);

    let response = response.map(|incoming| {
        Capped::new(incoming.map_err(Error::from), max_response, Some(until), Error::HttpResponseBodySize)
            .boxed_unsync()
    });
    let io: IoFuture = Box::new(async move {
        let Some(conn) = conn else { return Ok(()) };
        match tokio::time::timeout_at(until.into(), conn).await {
            Ok(ended) => ended.map_err(Error::from),
            Err(_) => Err(Error::HttpResponseTimeout),
        }
    });
    Ok((response, io))
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

/// The host's own name lookup (the guest has none), by the request's time
/// limit.
async fn resolve(target: &Target) -> Result<Vec<SocketAddr>, Error> {
    if let Some(ip) = parse_ip_host(&target.host) {
        return Ok(vec![SocketAddr::new(ip, target.port)]);
    }
    let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
    match tokio::time::timeout_at(target.until.into(), lookup).await {
        Err(_) => Err(Error::DnsTimeout),
        Ok(Err(e)) => Err(Error::DnsError { rcode: Some(e.to_string()), info_code: None }),
        Ok(Ok(addrs)) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if addrs.is_empty() { Err(Error::DestinationNotFound) } else { Ok(addrs) }
        }
    }
}

/// Connect to the first of `addrs` that answers.
async fn connect(addrs: &[SocketAddr], by: Instant) -> Result<TcpStream, Error> {
    let mut last = None;
    for addr in addrs {
        match tokio::time::timeout_at(by.into(), TcpStream::connect(addr)).await {
            Err(_) => return Err(Error::ConnectionTimeout),
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(e),
        }
    }
    Err(last.map_or(Error::DestinationUnavailable, Error::Connect))
}

/// A body that fails once more than `max` bytes have passed, or when
/// `until` comes while it waits for data.
struct Capped<B> {
    inner: B,
    seen: u64,
    max: u64,
    until: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The error for a body over `max`, given `max`.
    over: fn(Option<u64>) -> Error,
}

impl<B> Capped<B> {
    fn new(inner: B, max: u64, until: Option<Instant>, over: fn(Option<u64>) -> Error) -> Self {
        let until = until.map(|at| Box::pin(tokio::time::sleep_until(at.into())));
        Capped { inner, seen: 0, max, until, over }
    }
}

impl<B: Body<Data = Bytes, Error = Error> + Unpin> Body for Capped<B> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        if this.seen > this.max {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.seen = this.seen.saturating_add(data.len() as u64);
                    if this.seen > this.max {
                        return Poll::Ready(Some(Err((this.over)(Some(this.max)))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let late = this.until.as_mut().is_some_and(|until| until.as_mut().poll(cx).is_ready());
                if late {
                    this.seen = u64::MAX;
                    return Poll::Ready(Some(Err(Error::ConnectionReadTimeout)));
                }
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.seen > self.max || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
