"""NATS helpers shared by every process: pydantic models in and out, and the rule that a request always
gets a reply -- an :class:`~coorm.shared.protocol.Ack` (or the subject's own reply model) or an
:class:`~coorm.shared.protocol.ErrorReply` with a code and a readable message, never silence."""

from __future__ import annotations

import asyncio
import contextlib
import json
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


async def connect(url: str, name: str) -> NATS:
    return await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                              allow_reconnect=True)


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
