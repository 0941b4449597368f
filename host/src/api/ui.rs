//! The operator's dashboard at `/ui`, and the browser session it runs on.
//!
//! The pages are static files compiled into the binary (`host/ui/`): plain
//! HTML, CSS and one script that reads the same `/v1` API and event stream
//! every client uses, and writes guest text into the page only as text
//! (`textContent`), never as markup. No build step, no CDN: the binary
//! serves everything, offline.
//!
//! A browser signs in by posting the API token to `/ui/login`, which
//! answers with a session cookie (`HttpOnly`, `SameSite=Strict`); the token
//! itself never appears in a URL or in script. The cookie carries its
//! expiry and an HMAC of it keyed by the API token, so every replica that
//! shares the token accepts it, and the store keeps only sessions signed
//! out before their expiry, which every replica then refuses; changing the
//! token ends every session. A request the cookie authenticates that
//! changes something must carry an `Origin` of this server. Every `/ui`
//! answer carries a Content-Security-Policy that allows only this
//! server's own scripts, styles and connections.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::access::Principal;
use crate::api::AppState;
use crate::api::error::ApiError;
use crate::clock::Timestamp;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "leash_session";
/// How long a browser session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

const LOGIN_HTML: &str = include_str!("../../ui/login.html");
const INDEX_HTML: &str = include_str!("../../ui/index.html");
/// The dashboard's script modules, by name: `app.js` imports the rest.
const SCRIPTS: [(&str, &str); 7] = [
    ("app.js", include_str!("../../ui/app.js")),
    ("common.js", include_str!("../../ui/common.js")),
    ("jobs.js", include_str!("../../ui/jobs.js")),
    ("job.js", include_str!("../../ui/job.js")),
    ("approvals.js", include_str!("../../ui/approvals.js")),
    ("plan.js", include_str!("../../ui/plan.js")),
    ("schedules.js", include_str!("../../ui/schedules.js")),
];
const APP_CSS: &str = include_str!("../../ui/app.css");

/// Only this server's own files and connections; no inline script or
/// style, no frames, forms posting only here.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The `/ui` routes (no auth layer: they check the session themselves).
pub(super) fn routes() -> Router<Arc<AppState>> {
    let router = Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }));
    SCRIPTS.iter().fold(router, |router, &(name, text)| {
        router.route(&format!("/ui/{name}"), get(move |state, headers| script(state, headers, text)))
    })
}

/// A session cookie value, signed with the server's `token`, that
/// expires at `expires`: the session of the principal whose token `holder`
/// (its id) signed in, or of the bootstrap admin (`None`: the server's own
/// token signed in).
pub(super) fn session_value(token: &str, expires: Timestamp, nonce: &[u8; 16], holder: Option<&str>) -> String {
    let claims = format!("{}.{}.{}", expires.unix_ms(), hex::encode(nonce), holder.unwrap_or(BOOTSTRAP_HOLDER));
    format!("{claims}.{}", hex::encode(mac(token, &claims)))
}

/// The holder a session signed in with the server's own token names.
const BOOTSTRAP_HOLDER: &str = "-";

/// A session [`session_of`] found genuine and unexpired.
pub(super) struct Session {
    /// Its id (the nonce).
    pub(super) id: String,
    /// When it expires.
    pub(super) expires: Timestamp,
    /// The id of the principal token that signed in (`None`: the server's
    /// own).
    pub(super) holder: Option<String>,
}

fn mac(token: &str, claims: &str) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(b"leash-session:");
    mac.update(claims.as_bytes());
    mac.finalize().into_bytes().into()
}

/// A session this token issued that has not expired. Whether it was
/// ended early, and whether the token its holder signed in with still
/// works, are the store's to say.
pub(super) fn session_of(token: &str, value: &str, now: Timestamp) -> Option<Session> {
    let (claims, tag) = value.rsplit_once('.')?;
    let tag = hex::decode(tag).ok()?;
    let mut parts = claims.splitn(3, '.');
    let (expires, nonce, holder) = (parts.next()?, parts.next()?, parts.next()?);
    let expires = expires.parse::<i64>().ok()?;
    let genuine = bool::from(mac(token, claims).ct_eq(&tag[..])) && now.unix_ms() < expires;
    genuine.then(|| Session {
        id: nonce.to_owned(),
        expires: Timestamp::from_unix_ms(expires),
        holder: (holder != BOOTSTRAP_HOLDER).then(|| holder.to_owned()),
    })
}

/// The session cookie's value in `headers`, if any.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
}

/// Who a request is from, and whether a session cookie (rather than
/// `Authorization: Bearer`) said so. A session is the bootstrap
/// principal's: the server's token signed it in.
pub(super) struct Caller {
    /// Who it is.
    pub(super) principal: Principal,
    /// Signed in by the dashboard's session cookie.
    pub(super) by_session: bool,
}

/// Who the request is from, if anyone: the server's token, a principal's
/// token (live: read from the store, so a revocation holds on every
/// replica at once), or a session (one not signed out, likewise).
pub(super) async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match bearer {
        Some(token) if bool::from(token.as_bytes().ct_eq(state.config.token.as_bytes())) => {
            Ok(Caller { principal: Principal::bootstrap(), by_session: false })
        }
        Some(token) => match state.runtime.authenticate(token).await? {
            Some(principal) => Ok(Caller { principal, by_session: false }),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "wrong bearer token (or one expired, revoked, or whose principal was removed)",
            )),
        },
        None => match session_cookie(headers) {
            Some(value) => match session_of(&state.config.token, value, Timestamp::now()) {
                Some(session) => {
                    if state.runtime.session_ended(session.id).await? {
                        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "signed out: sign in"));
                    }
                    let principal = match session.holder {
                        None => Principal::bootstrap(),
                        Some(holder) => state.runtime.token_holder(&holder).await?.ok_or_else(|| {
                            ApiError::new(
                                StatusCode::UNAUTHORIZED,
                                "unauthorized",
                                "the token this session signed in with no longer works (revoked, expired, or its \
                                 principal removed): sign in",
                            )
                        })?,
                    };
                    Ok(Caller { principal, by_session: true })
                }
                None => {
                    Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "the session has expired: sign in"))
                }
            },
            None => {
                Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "missing `Authorization: Bearer <token>`"))
            }
        },
    }
}

/// A request a session cookie authenticates may change something only
/// from a page of this server: its `Origin` must name the `Host` it was
/// sent to (a page elsewhere cannot ride the cookie, whatever the browser
/// does with `SameSite`).
pub(super) fn check_origin(method: &Method, headers: &HeaderMap) -> Result<(), ApiError> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let refuse = |why: &str| ApiError::new(StatusCode::FORBIDDEN, "cross_origin", why.to_owned());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).ok_or_else(|| {
        refuse("a request signed in by the session cookie that changes something must carry an Origin header")
    })?;
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let origin_host = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    if host.is_empty() || origin_host != Some(host) {
        return Err(refuse(&format!("Origin {origin:?} is not this server ({host:?})")));
    }
    Ok(())
}

/// Headers every `/ui` answer carries.
fn protected(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends
    // `Origin: null` with the sign-in form, which the origin check refuses.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    protected(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

fn html(status: StatusCode, body: String) -> Response {
    protected((status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response())
}

fn login_page(status: StatusCode, message: &str) -> Response {
    // The one dynamic part is leash's own message, escaped all the same.
    html(status, LOGIN_HTML.replace("{{message}}", &escape_html(message)))
}

/// Text made safe to place in HTML.
pub(super) fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The dashboard, or the sign-in form without a session.
async fn page(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    match caller(&state, &headers).await {
        Ok(_) => html(StatusCode::OK, INDEX_HTML.to_owned()),
        Err(_) => login_page(StatusCode::OK, ""),
    }
}

/// A script module, to a signed-in browser only.
async fn script(State(state): State<Arc<AppState>>, headers: HeaderMap, text: &'static str) -> Response {
    match caller(&state, &headers).await {
        Ok(_) => asset("text/javascript; charset=utf-8", text),
        Err(e) => protected(e.into_response()),
    }
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// Exchange the API token for a session cookie.
async fn login(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    if let Err(e) = check_origin(&Method::POST, &headers) {
        return protected(e.into_response());
    }
    let Ok(Form(form)) = form else {
        return login_page(StatusCode::BAD_REQUEST, "send the form: token=<the API token>");
    };
    let token = form.token.trim();
    let holder = if bool::from(token.as_bytes().ct_eq(state.config.token.as_bytes())) {
        None
    } else {
        match state.runtime.authenticate(token).await {
            Ok(Some(_)) => crate::access::token_parts(token).map(|(id, _)| id.to_owned()),
            Ok(None) => {
                return login_page(
                    StatusCode::UNAUTHORIZED,
                    "That is not this server's API token, nor a working principal's token.",
                );
            }
            Err(e) => return protected(ApiError::from(e).into_response()),
        }
    };
    let mut nonce = [0u8; 16];
    if getrandom::fill(&mut nonce).is_err() {
        return protected(
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "no random source").into_response(),
        );
    }
    let expires = Timestamp::now().plus(SESSION_TTL);
    let cookie = format!(
        "{SESSION_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        session_value(&state.config.token, expires, &nonce, holder.as_deref()),
        SESSION_TTL.as_secs()
    );
    let mut response = protected((StatusCode::SEE_OTHER, [(header::LOCATION, "/ui")]).into_response());
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// End the session: its cookie is refused from now on, by every replica
/// (not only forgotten by this browser), and cleared here.
async fn logout(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = check_origin(&Method::POST, &headers) {
        return protected(e.into_response());
    }
    let session = session_cookie(&headers).and_then(|v| session_of(&state.config.token, v, Timestamp::now()));
    if let Some(Session { id, expires, .. }) = session
        && let Err(e) = state.runtime.session_end(id, expires).await
    {
        return protected(ApiError::from(e).into_response());
    }
    let cookie = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    let mut response = protected((StatusCode::SEE_OTHER, [(header::LOCATION, "/ui")]).into_response());
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("ASCII"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "a-token";

    #[test]
    fn a_session_holds_until_it_expires_and_only_for_its_token() {
        let t0 = Timestamp::from_unix_ms(1_000_000);
        let value = session_value(TOKEN, t0.plus(SESSION_TTL), &[7; 16], None);
        assert!(session_of(TOKEN, &value, t0).is_some_and(|s| s.holder.is_none()));
        let held = session_value(TOKEN, t0.plus(SESSION_TTL), &[7; 16], Some("0123456789abcdef"));
        assert_eq!(session_of(TOKEN, &held, t0).and_then(|s| s.holder).as_deref(), Some("0123456789abcdef"));
        let swapped = held.replacen("0123456789abcdef", "fedcba9876543210", 1);
        assert!(session_of(TOKEN, &swapped, t0).is_none(), "a holder changed by hand");
        assert!(session_of(TOKEN, &value, t0.plus(SESSION_TTL)).is_none(), "expired");
        assert!(session_of("another-token", &value, t0).is_none(), "another token's");
        let later = value.replacen(&t0.plus(SESSION_TTL).unix_ms().to_string(), "99999999999999", 1);
        assert!(session_of(TOKEN, &later, t0).is_none(), "an expiry moved by hand");
        for bad in ["", "x", "1.2", "1.2.zz", "1.2.-.zz", &value[..value.len() - 2]] {
            assert!(session_of(TOKEN, bad, t0).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_change_needs_an_origin_naming_this_host() {
        let with = |origin: Option<&str>| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7070"));
            if let Some(origin) = origin {
                headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            }
            headers
        };
        assert!(check_origin(&Method::GET, &with(None)).is_ok(), "reads need none");
        assert!(check_origin(&Method::POST, &with(Some("http://127.0.0.1:7070"))).is_ok());
        for origin in [None, Some("http://evil.example"), Some("http://127.0.0.1:7071"), Some("null")] {
            assert!(check_origin(&Method::POST, &with(origin)).is_err(), "{origin:?}");
        }
    }

    #[test]
    fn html_text_is_escaped() {
        assert_eq!(
            escape_html(r#"<script>alert("1")</script> & 'x'"#),
            "&lt;script&gt;alert(&quot;1&quot;)&lt;/script&gt; &amp; &#39;x&#39;"
        );
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; leash_session=abc.def; b=2"));
        assert_eq!(session_cookie(&headers), Some("abc.def"));
    }
}
