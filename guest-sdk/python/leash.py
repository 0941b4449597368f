"""Write leash plugins in Python.

A plugin is a WebAssembly component implementing the `leash:plugin@0.1.1`
world (`wit/plugin.wit`). componentize-py 0.25 builds one from a module
that defines a class named `WitWorld`; this module hides the generated
bindings behind a base class::

    import leash

    class WitWorld(leash.Plugin):
        def handle(self, ctx, input):
            name = leash.json_input(input, default={}).get("name", "world")
            leash.info(f"greeting {name}")
            return {"greeting": f"Hello, {name}!"}

Build it with::

    componentize-py -d wit -w plugin-http componentize -p path/to/guest-sdk/python app -o hello.wasm

and run it with ``leash run hello.wasm``.

Expected failures are raised as `Failed`, `InvalidInput` or `Retryable`
and reach the host through the WIT result. Any other exception is a crash:
the component traps, and the host reports `trap` with the traceback from
the guest's stderr.

This module knows nothing of the host beyond the WIT contract.
"""

import json
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from componentize_py_types import Err
from wit_world import WitWorld as _World
from wit_world.imports import host

try:
    from wit_world.imports import types
except ImportError:
    # The plugin-http world imports wasi:http's `types` too, so the
    # bindings name each by its package.
    from wit_world.imports import leash_plugin_types as types

__all__ = [
    "Context",
    "Failed",
    "HttpError",
    "InvalidInput",
    "Plugin",
    "Retryable",
    "cancelled",
    "debug",
    "error",
    "http",
    "info",
    "json_input",
    "json_output",
    "log",
    "plan",
    "progress",
    "trace",
    "warn",
]


class Failed(Exception):
    """The work failed; retrying will not help (`guest_error`)."""


class InvalidInput(Exception):
    """The input was malformed or unacceptable (`invalid_input`)."""


class Retryable(Exception):
    """A transient failure: a durable job with attempts left runs again."""


@dataclass(frozen=True)
class Context:
    """Facts about the running job."""

    job_id: str
    """The job's ULID; empty for a one-shot ``leash run``."""
    target: str
    """``"execute"``, ``"apply"`` or ``"action:NAME"``."""
    action: Optional[str]
    """The action's name when the target is an action, else None."""
    attempt: int
    """1 for the first attempt, 2 for the first retry, and so on."""
    deadline_unix_ms: int
    """When the host stops the plugin, in ms since the Unix epoch (UTC)."""

    @staticmethod
    def _of(ctx: types.JobContext) -> "Context":
        target = ctx.target
        if isinstance(target, types.Target_Action):
            name, action = f"action:{target.value}", target.value
        elif isinstance(target, types.Target_Apply):
            name, action = "apply", None
        else:
            name, action = "execute", None
        return Context(ctx.job_id, name, action, ctx.attempt, ctx.deadline_unix_ms)


_LEVELS = {
    "trace": host.Level.TRACE,
    "debug": host.Level.DEBUG,
    "info": host.Level.INFO,
    "warn": host.Level.WARN,
    "error": host.Level.ERROR,
}


def log(level: str, message: str, **fields: Any) -> None:
    """Record a structured log line; ``fields`` become key/value strings."""
    try:
        wit_level = _LEVELS[level]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}") from None
    host.log(wit_level, str(message), [(str(k), str(v)) for k, v in fields.items()])


def trace(message: str, **fields: Any) -> None:
    log("trace", message, **fields)


def debug(message: str, **fields: Any) -> None:
    log("debug", message, **fields)


def info(message: str, **fields: Any) -> None:
    log("info", message, **fields)


def warn(message: str, **fields: Any) -> None:
    log("warn", message, **fields)


def error(message: str, **fields: Any) -> None:
    log("error", message, **fields)


def progress(done: int, total: int, note: str = "") -> bool:
    """Report progress; True means stop now (cancelled or shutting down)."""
    return host.progress(done, total, note)


def cancelled() -> bool:
    """True once the job has been asked to stop."""
    return host.cancelled()


_NO_DEFAULT = object()


def json_input(data: bytes, default: Any = _NO_DEFAULT) -> Any:
    """Decode JSON input. Empty input gives ``default`` when one is given;
    anything that is not JSON raises `InvalidInput`."""
    if default is not _NO_DEFAULT and not bytes(data).strip():
        return default
    try:
        return json.loads(bytes(data))
    except ValueError as e:
        raise InvalidInput(f"input is not valid JSON for this plugin: {e}") from None


def json_output(value: Any) -> bytes:
    """Encode a value as JSON output."""
    try:
        return json.dumps(value, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
        raise Failed(f"cannot encode output as JSON: {e}") from None


class Plugin(_World):
    """The base class of a plugin: subclass it as ``WitWorld`` and
    implement `handle`. It may return bytes (the output as is), a str
    (UTF-8) or any other value (encoded as JSON)."""

    def handle(self, ctx: Context, input: bytes) -> Any:
        raise NotImplementedError("a leash plugin implements handle(self, ctx, input)")

    def run(self, ctx: types.JobContext, input: bytes) -> bytes:
        try:
            out = self.handle(Context._of(ctx), input)
        except Failed as e:
            raise Err(types.JobError_Failed(str(e)))
        except InvalidInput as e:
            raise Err(types.JobError_InvalidInput(str(e)))
        except Retryable as e:
            raise Err(types.JobError_Retryable(str(e)))
        except HttpError as e:
            raise Err(types.JobError_Retryable(str(e)) if e.retryable else types.JobError_Failed(str(e)))
        if isinstance(out, (bytes, bytearray, memoryview)):
            return bytes(out)
        if isinstance(out, str):
            return out.encode()
        try:
            return json_output(out)
        except Failed as e:
            raise Err(types.JobError_Failed(str(e)))


# Outbound HTTP -------------------------------------------------------------

# Errors after which the same request may well succeed later.
_RETRYABLE_CODES = frozenset(
    [
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
    ]
)
_ACRONYMS = frozenset(["dns", "tls", "http", "ip"])


class HttpError(Exception):
    """An outbound request that got no response. ``code`` is the wasi:http
    error code (``"HTTP-request-denied"``: the job's grant does not allow
    it, and the job's logs say which ``--allow-host`` rule would;
    ``"connection-refused"``, ``"HTTP-response-timeout"``, ...; for a
    header the request may not carry, ``"forbidden"`` or
    ``"invalid-syntax"``), and
    ``retryable`` whether the same request may succeed later. Left
    uncaught, it fails the job: as `Retryable` when ``retryable``, else as
    `Failed`. A response with an error status is not an `HttpError`."""

    def __init__(self, method: str, url: str, code: str, detail: Optional[str] = None):
        self.method, self.url, self.code, self.detail = method, url, code, detail
        self.retryable = code in _RETRYABLE_CODES
        why = f"{code}: {detail}" if detail else code
        if code == "HTTP-request-denied":
            why += " (not granted to this job; its logs name the --allow-host rule that grants it)"
        super().__init__(f"{method} {url}: {why}")


@dataclass(frozen=True)
class Response:
    """What came back: the status, the headers (names lowercase, in the
    order received) and the whole body."""

    status: int
    headers: List[Tuple[str, str]]
    body: bytes

    @property
    def ok(self) -> bool:
        """True for a 2xx status."""
        return 200 <= self.status < 300

    def header(self, name: str) -> Optional[str]:
        """The first value of a header, or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def text(self) -> str:
        """The body as UTF-8 (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body decoded as JSON; `Failed` if it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise Failed(f"the response ({self.status}) is not JSON: {e}: {self.text()[:200]!r}") from None


def _code_name(code: Any) -> Tuple[str, Optional[str]]:
    """A wasi:http error-code (or header-error) value as its WIT name, and
    its detail."""
    words = re.findall(r"[A-Z][a-z0-9]*", type(code).__name__.split("_", 1)[-1])
    name = "-".join(w.upper() if w.lower() in _ACRONYMS else w.lower() for w in words)
    detail = getattr(code, "value", None)
    return name, detail if isinstance(detail, str) else None


# Imported now, while componentize-py snapshots the module: a component
# has no files to import from when it runs.
try:
    from wit_world.imports import outgoing_handler as _outgoing_handler
    from wit_world.imports import streams as _streams
    from wit_world.imports import wasi_http_types as _wasi_http
except ImportError:  # built for the plain plugin world
    _outgoing_handler = None


def _bindings() -> Any:
    if _outgoing_handler is None:
        raise Failed(
            "leash.http needs the plugin-http world: build with "
            "componentize-py -d wit -w plugin-http componentize app -o NAME.wasm "
            "(a folder made by leash new carries the WIT it needs)"
        )
    return _outgoing_handler, _streams, _wasi_http


def _request(
    method: str,
    url: str,
    headers: Optional[Dict[str, str]] = None,
    body: Optional[bytes] = None,
    timeout: Optional[float] = None,
) -> Response:
    """Send one request and read the whole response. A header value may
    name a secret, ``{secret:NAME}``: the host puts in its value when the
    job's grant lets this request carry it (the plugin never sees it).
    ``timeout`` (seconds) bounds the connect, the wait for the first
    response byte and each wait between body bytes; the job's deadline
    bounds it all. Raises `HttpError` when no response comes."""
    outgoing_handler, streams, wh = _bindings()
    method = method.upper()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Failed(f"{method} {url}: not an http:// or https:// URL")
    fields = wh.Fields()
    for name, value in (headers or {}).items():
        try:
            fields.append(str(name), str(value).encode())
        except Err as e:
            # A header the host will not send (`connection`, `host`, ...)
            # or one that is not valid: named by wasi:http's header-error.
            fields.__exit__(None, None, None)
            raise HttpError(method, url, _code_name(e.value)[0], f"header {name}") from None
    outgoing = wh.OutgoingRequest(fields)
    known = {"GET": wh.Method_Get(), "HEAD": wh.Method_Head(), "POST": wh.Method_Post(), "PUT": wh.Method_Put(),
             "DELETE": wh.Method_Delete(), "PATCH": wh.Method_Patch(), "OPTIONS": wh.Method_Options()}
    outgoing.set_method(known.get(method) or wh.Method_Other(method))
    outgoing.set_scheme(wh.Scheme_Https() if parts.scheme == "https" else wh.Scheme_Http())
    outgoing.set_authority(parts.netloc)
    outgoing.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    options = None
    if timeout is not None:
        ns = int(timeout * 1e9)
        options = wh.RequestOptions()
        options.set_connect_timeout(ns)
        options.set_first_byte_timeout(ns)
        options.set_between_bytes_timeout(ns)
    out_body = outgoing.body()

    def failed(code: Any) -> HttpError:
        return HttpError(method, url, *_code_name(code))

    try:
        future = outgoing_handler.handle(outgoing, options)
    except Err as e:
        out_body.__exit__(None, None, None)
        raise failed(e.value) from None
    # Each resource is dropped before the one it came from (a parent with
    # live children cannot be dropped).
    with future:
        stream = out_body.write()
        with stream:
            data = bytes(body or b"")
            try:
                for at in range(0, len(data), 4096):
                    stream.blocking_write_and_flush(data[at : at + 4096])
            except Err:
                pass  # the host refused the body; the response says why
        wh.OutgoingBody.finish(out_body, None)
        with future.subscribe() as ready:
            ready.block()
        got = future.get()  # Ok(Ok(response)) or Ok(Err(error-code))
        if got is None or isinstance(got, Err):
            raise HttpError(method, url, "internal-error", "no response")
        if isinstance(got.value, Err):
            raise failed(got.value.value)
        with got.value.value as response:
            with response.headers() as fields:
                received = [(k.lower(), v.decode("utf-8", errors="replace")) for k, v in fields.entries()]
            incoming = response.consume()
            chunks = []
            with incoming.stream() as reading:
                while True:
                    try:
                        chunks.append(reading.blocking_read(64 << 10))
                    except Err as e:
                        if isinstance(e.value, streams.StreamError_Closed):
                            break
                        code = wh.http_error_code(e.value.value)
                        raise failed(code) if code is not None else HttpError(method, url, "HTTP-protocol-error")
            with wh.IncomingBody.finish(incoming):
                pass
            return Response(response.status(), received, b"".join(chunks))


def _get(url: str, headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> Response:
    """``leash.http.request("GET", url, headers, timeout=timeout)``."""
    return _request("GET", url, headers, timeout=timeout)


def _post_json(
    url: str, value: Any, headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None
) -> Response:
    """POST ``value`` as JSON (``content-type: application/json`` unless
    ``headers`` sets one)."""
    sent = {"content-type": "application/json", **{k.lower(): v for k, v in (headers or {}).items()}}
    return _request("POST", url, sent, json.dumps(value).encode(), timeout)


http = ModuleType(
    "leash.http",
    "Outbound HTTP through wasi:http: ``leash.http.get(url)``, ``leash.http.post_json(url, value)``, "
    "``leash.http.request(method, url, headers, body, timeout)``. The host sends a request only if the job's "
    "grant allows it (``leash run --allow-host 'GET https://api.example.com'``).",
)
http.request, http.get, http.post_json = _request, _get, _post_json
http.Response, http.HttpError = Response, HttpError


# Plans ---------------------------------------------------------------------

try:
    from wit_world.imports import plan as _plan
except ImportError:  # built against a contract before 0.1.1
    _plan = None


def _plan_bindings() -> Any:
    if _plan is None:
        raise Failed("leash.plan needs leash:plugin@0.1.1: rebuild with the WIT leash new gives")
    return _plan


def _propose(
    method: str, url: str, headers: Optional[Dict[str, str]] = None, body: Optional[bytes] = None
) -> int:
    """In a plan's execute phase: propose this write for the apply phase to
    send once a person approves the plan. The host checks it against the
    job's grant as if it were being sent and records it with the plan.
    Returns its number (from 1); a proposal the grant refuses raises
    `Failed` with the host's reason (and fails the phase even if caught)."""
    p = _plan_bindings()
    if isinstance(body, str):
        body = body.encode()
    effect = p.Effect(method.upper(), url, [(str(k), str(v)) for k, v in (headers or {}).items()], bytes(body or b""))
    try:
        return p.propose(effect)
    except Err as e:
        raise Failed(f"proposal refused: {e.value}") from None


def _approved() -> List[Tuple[int, Dict[str, Any]]]:
    """In a plan's apply phase: the approved proposals not sent yet, in
    order, as ``(number, {"method", "url", "headers", "body"})``. Each may
    be sent once, exactly as proposed."""
    return [
        (n, {"method": e.method, "url": e.url, "headers": dict(e.headers), "body": bytes(e.body)})
        for n, e in _plan_bindings().approved()
    ]


def _send_approved() -> List[Tuple[int, Response]]:
    """Send every approved proposal not sent yet, in order; the responses
    by number. An error status raises `Failed` (the proposal counts as
    sent); no response raises `HttpError` (retryable where sending again
    may work: a later attempt sends it under the same Idempotency-Key)."""
    approved = _approved()
    sent = []
    for i, (n, e) in enumerate(approved):
        shown = f"proposal #{n} ({e['method']} {e['url']})"
        response = _request(e["method"], e["url"], e["headers"], e["body"])
        if not response.ok:
            raise Failed(f"{shown}: the upstream answered {response.status}: {response.text()[:200]}")
        sent.append((n, response))
        if progress(i + 1, len(approved), shown):
            raise Failed(f"stopped after {i + 1} of {len(approved)} approved proposals")
    return sent


plan = ModuleType(
    "leash.plan",
    "Plans: in the execute phase, ``leash.plan.propose(method, url, headers, body)`` each write (the host "
    "refuses writes there); in the apply phase, ``leash.plan.send_approved()`` sends exactly the approved ones.",
)
plan.propose, plan.approved, plan.send_approved = _propose, _approved, _send_approved
