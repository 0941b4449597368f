//! `GET /v1/events`: the change feed as Server-Sent Events.
//!
//! Each event is `id: <event id>`, `event: <type>` and one line of JSON
//! data; a comment every 15 s keeps idle connections open. A client
//! resumes after the last id it saw with `Last-Event-ID` (browsers send it
//! when they reconnect) or `?after=`; without either it starts from now.
//! Where retention deleted events after that id, the stream first sends
//! `event: missed` and goes on from the oldest kept.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::access::Principal;
use crate::api::access::reads_all;
use crate::api::error::{ApiError, ErrorBody, query_error};
use crate::api::{AppState, parse_id};
use crate::job::{Event, EventId, JobId};
use crate::runtime::{EventStream, StreamItem};
use crate::store::EventFilter;

/// Filters of `GET /v1/events`; unset ones match everything. A job, plan,
/// plugin or status filter leaves worker events out.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    /// Only this job's events.
    #[param(value_type = Option<JobId>)]
    job: Option<String>,
    /// Only events of this plan's jobs.
    plan: Option<String>,
    /// Only events of this plugin's jobs: a digest, a name or `name@version`.
    #[param(pattern = "^((sha256:)?[0-9a-f]{64}|[a-z0-9][a-z0-9_-]{0,63}(@[A-Za-z0-9._+-]{1,64})?)$")]
    plugin: Option<String>,
    /// Only job events that leave the job in one of these states
    /// (comma-separated).
    #[param(example = "succeeded,failed")]
    status: Option<String>,
    /// Resume after this event (`Last-Event-ID`, when sent, wins).
    #[param(value_type = Option<EventId>)]
    after: Option<String>,
}

impl EventsQuery {
    fn filter(&self) -> Result<EventFilter, ApiError> {
        let status = super::list::states(self.status.as_deref())?;
        Ok(EventFilter {
            job: self.job.as_deref().map(parse_id).transpose()?,
            plan_id: self.plan.clone(),
            plugin: self.plugin.as_deref().map(str::parse).transpose().map_err(ApiError::bad_request)?,
            status,
        })
    }
}

/// The job and worker events of every process sharing the store, live.
#[utoipa::path(get, path = "/v1/events", tag = "events",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<EventId>, Header, description = "Resume after this event"),
    ),
    responses(
        (status = 200, description = "A stream of `text/event-stream` events: `id` is the event id, `event` its \
            type, `data` the event as JSON; `event: missed` (no id) says events were deleted before they were read",
            content_type = "text/event-stream", body = Event),
        (status = 400, description = "Refused: the message names the field", body = ErrorBody),
        (status = 401, description = "Missing or wrong token", body = ErrorBody),
        (status = 403, description = "`forbidden`: a principal with only `submit` reads its own jobs, \
            not every job's events", body = ErrorBody),
    ))]
pub(super) async fn events(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    if !reads_all(&principal) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "the event stream shows every job's changes: it needs the `approve` or `operate` role; principal \
                 {:?} reads its own jobs at GET /v1/jobs",
                principal.name
            ),
        ));
    }
    let Query(query) = query.map_err(query_error)?;
    let filter = query.filter()?;
    let resume = match headers.get("last-event-id") {
        Some(value) => Some(value.to_str().map_err(|_| ApiError::bad_request("`Last-Event-ID` is not text"))?),
        None => query.after.as_deref(),
    };
    let after = resume
        .filter(|id| !id.trim().is_empty())
        .map(str::parse::<EventId>)
        .transpose()
        .map_err(ApiError::bad_request)?;
    let stream = state.runtime.events(after, filter).await?;
    let listener = Listener::new(stream, state.runtime.metrics().event_clients.clone());
    let body = futures_util::stream::unfold(listener, |mut listener| async move {
        let frame = listener.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), listener))
    });
    Ok(Sse::new(body).keep_alive(KeepAlive::default()).into_response())
}

/// One connected client: its place in the feed, counted while it is open.
struct Listener {
    stream: EventStream,
    clients: prometheus_client::metrics::gauge::Gauge,
    /// Set after a store failure was sent: the stream ends there.
    failed: bool,
}

impl Listener {
    fn new(stream: EventStream, clients: prometheus_client::metrics::gauge::Gauge) -> Self {
        clients.inc();
        Listener { stream, clients, failed: false }
    }

    /// The next frame, or `None` to end the stream (after a failure, which
    /// the client hears about and can resume from).
    async fn next_frame(&mut self) -> Option<SseEvent> {
        if self.failed {
            return None;
        }
        Some(match self.stream.next().await {
            Ok(StreamItem::Event(event)) => frame(&event),
            Ok(StreamItem::Missed) => SseEvent::default().event("missed").data(
                r#"{"message":"events after the given id were deleted before they were read: reload what you show"}"#,
            ),
            Err(e) => {
                self.failed = true;
                let body = serde_json::json!({ "message": format!("the event stream stopped: {e}; resume it") });
                SseEvent::default().event("error").data(body.to_string())
            }
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.clients.dec();
    }
}

/// An event as its SSE frame. The data is JSON on one line: guest text in
/// it (a progress note) is escaped, never raw.
fn frame(event: &Event) -> SseEvent {
    let data = serde_json::to_string(event).unwrap_or_else(|_| "{}".to_owned());
    SseEvent::default().id(event.id.to_string()).event(event.kind.as_str()).data(data)
}
