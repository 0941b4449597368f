"""Write leash plugins in Python.

A plugin is a WebAssembly component implementing the `leash:plugin@0.1.0`
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

    componentize-py -d wit -w plugin componentize -p path/to/guest-sdk/python app -o hello.wasm

and run it with ``leash run hello.wasm``.

Expected failures are raised as `Failed`, `InvalidInput` or `Retryable`
and reach the host through the WIT result. Any other exception is a crash:
the component traps, and the host reports `trap` with the traceback from
the guest's stderr.

This module knows nothing of the host beyond the WIT contract.
"""

import json
from dataclasses import dataclass
from typing import Any, Optional

from componentize_py_types import Err
from wit_world import WitWorld as _World
from wit_world.imports import host, types

__all__ = [
    "Context",
    "Failed",
    "InvalidInput",
    "Plugin",
    "Retryable",
    "cancelled",
    "debug",
    "error",
    "info",
    "json_input",
    "json_output",
    "log",
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
        if isinstance(out, (bytes, bytearray, memoryview)):
            return bytes(out)
        if isinstance(out, str):
            return out.encode()
        try:
            return json_output(out)
        except Failed as e:
            raise Err(types.JobError_Failed(str(e)))
