"""NATS helpers shared by every process: pydantic models in and out, and the rule that a request always
gets a reply -- an :class:`~coorm.shared.protocol.Ack` (or the subject's own reply model) or an
:class:`~coorm.shared.protocol.ErrorReply` with a code and a readable message, never silence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pydantic import BaseModel, ValidationError

from coorm.shared import subjects
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import ErrorBody, ErrorReply

log = structlog.get_logger("coorm.bus")
M = TypeVar("M", bound=BaseModel)


class WireError(Exception):
    """A request refused with a protocol error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def reply(self) -> ErrorReply:
        return ErrorReply(error=ErrorBody(code=self.code, message=self.message))


RECONNECT_WAIT = 0.5  # seconds between two attempts to reach a lost server


class Unreachable(Exception):
    """CooRM's NATS could not be reached: not at all within the connect timeout, or no longer within the
    reconnect window after the connection was lost. ``source`` says where the URL came from, so that the
    user knows what to fix."""

    def __init__(self, url: str, source: str, seconds: float, *, lost: bool = False) -> None:
        self.url, self.source, self.seconds, self.lost = url, source, seconds, lost
        where = f"{redact(url)} (from {source})" if source else redact(url)
        if lost:
            text = f"lost CooRM at {where} and could not reach it again within {seconds:g} s"
        else:
            text = f"cannot reach CooRM at {where} within {seconds:g} s: is it running? Start one with 'coorm up'"
        super().__init__(text)


def redact(url: str) -> str:
    """The URL without its password (it goes into messages and logs)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc).geturl()


async def connect(url: str, name: str) -> NATS:
    """A server's connection (services, agents): supervised processes that must outlive a nats-server
    restart, so every attempt is retried for ever, with one log line per failure rather than a traceback."""
    return await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=RECONNECT_WAIT,
                              allow_reconnect=True, error_cb=_log_error(url))


async def connect_client(url: str, name: str, *, timeout: float, reconnect_window: float, source: str = "",
                         closed_cb: Callable[[], Awaitable[None]] | None = None) -> NATS:
    """A client's connection (the command line, a launcher): gives up on the first connection after
    ``timeout`` seconds with :class:`Unreachable`; once connected, rides over a server's restart for about
    ``reconnect_window`` seconds, then closes (``closed_cb`` runs: the client must tell its user)."""
    nc = NATS()
    attempts = max(1, math.ceil(reconnect_window / RECONNECT_WAIT))

    async def quiet(e: Exception) -> None:
        """Each failed attempt: nothing (nats-py would log a traceback); the outcome is reported once, by
        the caller."""

    async def closed() -> None:
        if closed_cb is not None:
            await closed_cb()

    try:
        await asyncio.wait_for(nc.connect(url, name=name, connect_timeout=max(1, math.ceil(timeout)),
                                          allow_reconnect=True, max_reconnect_attempts=attempts,
                                          # nats-py annotates an int; it sleeps on any number
                                          reconnect_time_wait=RECONNECT_WAIT,  # type: ignore[arg-type]
                                          error_cb=quiet, closed_cb=closed),
                               timeout)
    except (TimeoutError, OSError, nats.errors.Error) as e:
        with contextlib.suppress(Exception):
            await nc.close()
        raise Unreachable(url, source, timeout) from e
    return nc


def _log_error(url: str) -> Callable[[Exception], Awaitable[None]]:
    async def on_error(e: Exception) -> None:
        log.warning("nats error", url=redact(url), error=f"{type(e).__name__}: {e}")

    return on_error


async def shutdown(nc: NATS, timeout: float = 2.0) -> None:
    """Flush what was published, then close. (Not ``drain``: a pull subscription's unread messages hold a
    drain for its whole timeout, and a drain cut short can leave the socket open.)"""
    if nc.is_closed:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.flush(), timeout)
    with contextlib.suppress(Exception):
        await nc.close()


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def decode(data: bytes, model: type[M]) -> M:
    """Parse a message, turning every way it can be wrong into a :class:`WireError` that says why."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError(ErrorCode.BAD_MESSAGE, f"not JSON: {e}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or '(message)'}: {err['msg']}" for err in e.errors()[:5]
        )
        raise WireError(ErrorCode.BAD_MESSAGE, f"not a valid {model.__name__}: {problems}") from None


Handler = Callable[[M, Msg], Awaitable[BaseModel | None]]


_running: set[asyncio.Task] = set()


async def serve(nc: NATS, subject: str, model: type[M], handler: Handler, *, queue: str = "",
                concurrent: bool = False):
    """Subscribe ``handler`` to ``subject``: it gets the parsed message and returns the reply model (or None
    for a publish that expects no reply). A :class:`WireError` becomes an ``ErrorReply``; any other
    exception too (code ``unavailable``), logged, so that the caller never waits for nothing.

    A subscription's messages are handled one after the other; with ``concurrent`` each gets its own task,
    so that a handler waiting on I/O does not hold the next (callers that need an order wait for replies)."""
    # only servers serve: a launcher importing this module registers no Prometheus metrics
    from coorm.shared import metrics

    async def on_msg(msg: Msg) -> None:
        if concurrent:
            task = asyncio.create_task(handle(msg))
            _running.add(task)
            task.add_done_callback(_running.discard)
        else:
            await handle(msg)

    async def handle(msg: Msg) -> None:
        metrics.messages_received.labels(subjects.verb_of(msg.subject)).inc()
        try:
            parsed = decode(msg.data, model)
            out = await handler(parsed, msg)
        except WireError as e:
            out = e.reply()
        except Exception as e:  # noqa: BLE001 - a reply must go out whatever went wrong
            log.exception("handler failed", subject=msg.subject)
            out = WireError(ErrorCode.UNAVAILABLE, f"internal error: {type(e).__name__}: {e}").reply()
        if isinstance(out, ErrorReply):
            metrics.error_replies.labels(out.error.code.value).inc()
        if msg.reply and out is not None:
            await msg.respond(encode(out))

    return await nc.subscribe(subject, queue=queue, cb=on_msg)


async def call(nc: NATS, subject: str, message: BaseModel, reply: type[M], *, timeout: float = 5.0) -> M:
    """Request/reply: the parsed reply, or :class:`WireError` if the other side refused."""
    msg = await nc.request(subject, encode(message), timeout=timeout)
    raw = json.loads(msg.data)
    if isinstance(raw, dict) and raw.get("ok") is False:
        err = ErrorReply.model_validate(raw).error
        raise WireError(err.code, err.message)
    return reply.model_validate(raw)
