"""NATS helpers shared by every process: pydantic models in and out, and the rule that a request always
gets a reply -- an :class:`~coorm.shared.protocol.Ack` (or the subject's own reply model) or an
:class:`~coorm.shared.protocol.ErrorReply` with a code and a readable message, never silence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import nats
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pydantic import BaseModel, TypeAdapter, ValidationError

from coorm.shared import subjects
from coorm.shared.connection import Resends, nats_servers, redact, refused_text, unreachable_text
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import DeadLetter, ErrorBody, ErrorReply
from coorm.shared.requests import Identifier
from coorm.shared.tasks import within

if TYPE_CHECKING:
    from coorm.shared.credentials import Identity

log = structlog.get_logger("coorm.bus")
M = TypeVar("M", bound=BaseModel)


MAX_ERROR_CHARS = 1000  # an error's message is cut there: it may quote what was sent, which may be huge


def _bounded(text: str) -> str:
    """``text`` cut to :data:`MAX_ERROR_CHARS` and encodable whatever it quotes (a 1 MB field name, a lone
    surrogate), so that a reply saying why always fits in a message and always goes out."""
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + "..."
    return text.encode("utf-8", "backslashreplace").decode()


class WireError(Exception):
    """A request refused with a protocol error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        message = _bounded(message)
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def reply(self) -> ErrorReply:
        return ErrorReply(error=ErrorBody(code=self.code, message=self.message))


# seconds a client waits for the answer to a command before it sends it again: one that reached a leader as it
# died is answered by nobody, and goes to the next leader only then (the SDK's calls; a take-over's grace)
RESEND_AFTER = 5.0
RECONNECT_WAIT = 0.5  # seconds between two attempts to reach a lost server
LOOK_RETRY = 0.1  # seconds between two attempts to reach a server a look asks through
LOOK_REACH = 2.0  # seconds to reach another server of the list, looking for the other end there
MAX_LOOK_EVERY = 8  # unanswered heartbeats (or probes) between two looks elsewhere, at most


class Unreachable(Exception):
    """CooRM's NATS could not be reached: not at all within the connect timeout, or no longer within the
    reconnect window after the connection was lost. ``source`` says where the URL came from, so that the
    user knows what to fix."""

    def __init__(self, url: str, source: str, seconds: float, *, lost: bool = False) -> None:
        self.url, self.source, self.seconds, self.lost = url, source, seconds, lost
        super().__init__(unreachable_text(url, source, seconds, lost=lost))


class Refused(Exception):
    """CooRM's NATS answered but would not let this process in: no credentials, or not ones it knows."""

    def __init__(self, url: str, identity: Identity | None) -> None:
        self.url, self.identity = url, identity
        super().__init__(refused_text(url, None if identity is None else (identity.role.value, identity.name)))




def _auth(identity: Identity | None) -> dict:
    """nats-py's arguments for connecting as ``identity``: its nkey (nats-py signs the server's nonce with
    it) and its own inbox prefix, the only one it may read replies on."""
    if identity is None:
        return {}
    return {"nkeys_seed_str": identity.seed, "inbox_prefix": identity.inbox_prefix}


async def connect(url: str, name: str, identity: Identity | None = None,
                  reconnected_cb: Callable[[], Awaitable[None]] | None = None) -> NATS:
    """A server's connection (services, agents): supervised processes that must outlive a nats-server
    restart, so every attempt is retried for ever, with one log line per failure rather than a traceback.
    ``reconnected_cb``: what was sent to it while it was cut is lost (core NATS): ask for it again there."""
    extra = {"reconnected_cb": reconnected_cb} if reconnected_cb is not None else {}
    return await nats.connect(nats_servers(url), name=name, max_reconnect_attempts=-1,
                              reconnect_time_wait=RECONNECT_WAIT, allow_reconnect=True, error_cb=_log_error(url),
                              **extra, **_auth(identity))


async def connect_client(url: str, name: str, *, timeout: float, reconnect_window: float, source: str = "",
                         identity: Identity | None = None,
                         closed_cb: Callable[[], Awaitable[None]] | None = None,
                         reconnected_cb: Callable[[], Awaitable[None]] | None = None) -> NATS:
    """A client's connection (the command line, a launcher): gives up on the first connection after
    ``timeout`` seconds with :class:`Unreachable`; once connected, rides over a server's restart for about
    ``reconnect_window`` seconds, then closes (``closed_cb`` runs: the client must tell its user)."""
    nc = NATS()
    attempts = max(1, math.ceil(reconnect_window / RECONNECT_WAIT))

    refusals: list[Exception] = []

    async def quiet(e: Exception) -> None:
        """Each failed attempt: nothing (nats-py would log a traceback); the outcome is reported once, by
        the caller. A refusal of the credentials is remembered: it is the outcome, not an outage."""
        if "authorization violation" in str(e).lower():
            refusals.append(e)

    async def closed() -> None:
        if closed_cb is not None:
            await closed_cb()

    async def reconnected() -> None:
        if reconnected_cb is not None:
            await reconnected_cb()

    try:
        await asyncio.wait_for(nc.connect(nats_servers(url), name=name, connect_timeout=max(1, math.ceil(timeout)),
                                          allow_reconnect=True, max_reconnect_attempts=attempts,
                                          # nats-py annotates an int; it sleeps on any number
                                          reconnect_time_wait=RECONNECT_WAIT,  # type: ignore[arg-type]
                                          error_cb=quiet, closed_cb=closed, reconnected_cb=reconnected,
                                          **_auth(identity)),
                               timeout)
    except (TimeoutError, OSError, nats.errors.Error) as e:
        with contextlib.suppress(Exception):
            await nc.close()
        if refusals or "authorization violation" in str(e).lower():
            raise Refused(url, identity) from e
        raise Unreachable(url, source, timeout) from e
    return nc


async def move_to(nc: NATS, host: str | None, port: int | None) -> None:
    """Reconnect ``nc`` to the server at ``host:port`` of its pool. nats-py's ``force_reconnect`` takes the
    next server of its pool, shuffled first: the pool is put in order, that server first, and kept in order
    (round robin, from then on)."""
    nc.options["dont_randomize"] = True
    nc._server_pool.sort(key=lambda srv: (srv.uri.hostname, srv.uri.port) != (host, port))  # (a stable sort)
    await nc.force_reconnect()


_LOOKS: weakref.WeakKeyDictionary[NATS, asyncio.Lock] = weakref.WeakKeyDictionary()


async def leave_if_cut_off(nc: NATS, urls: list[str], there_answers: Callable[[str], Awaitable[bool]],
                           here_answers: Callable[[], Awaitable[bool]],
                           moving: Callable[[str, str], None]) -> bool:
    """Whether the other end (the RMS, the allocator) answered through another server of ``urls`` -- asked by
    ``there_answers(url)`` over a connection of its own -- while still not through ``nc``'s (``here_answers``
    asked again, as the look may have raced a take-over): then ``moving(here, url)`` is told and ``nc`` moves
    there. How a client whose server is cut from the cluster (alive, so nats-py stays with it, but nothing
    beyond it hears) leaves it. One look at a time on a connection: those who share it (the batch service and
    its jobs' sessions) wait for the one under way, whose move their own look then finds made."""
    async with _LOOKS.setdefault(nc, asyncio.Lock()):
        if not nc.is_connected or nc.connected_url is None:
            return False  # reconnecting already: nats-py looks for a server itself
        here = (nc.connected_url.hostname, nc.connected_url.port)
        for url in urls:
            there = urlsplit(url)
            if (there.hostname, there.port) == here or not await there_answers(url):
                continue
            if await here_answers():
                return True  # answered here meanwhile: this server reaches it
            moving(f"{here[0]}:{here[1]}", url)
            await move_to(nc, there.hostname, there.port)
            return True
        return False


def asking(subject: str, message: BaseModel, reply: type[BaseModel], *,
           timeout: float) -> Callable[[NATS], Awaitable[object]]:
    """What :func:`answered_through` asks: ``message`` on ``subject``, answered ``reply`` within ``timeout``."""
    return lambda nc: call(nc, subject, message, reply, timeout=timeout)


async def answered_through(url: str, name: str, identity: Identity | None, ask: Callable[[NATS], Awaitable[object]],
                           *, reach: float = LOOK_REACH) -> bool:
    """Whether ``ask``, over a connection of its own to the server at ``url`` (reached within ``reach``
    seconds), returns rather than raises: how a client whose server may be cut from the cluster (alive,
    reaching nothing) finds out whether another server of its list does better."""
    async def quiet(e: Exception) -> None:
        """(nats-py would log a traceback for a server this look does not reach)"""

    try:
        # nats-py tries a server it failed to reach again within the same connect, after reconnect_time_wait
        # (2 s by default: the whole look's window); a failure that passes at once (seen in the partition
        # test: *no route to host* once, just after a link came up or went down) is retried within ``reach``
        nc = await within(nats.connect([url], name=name, connect_timeout=1, allow_reconnect=False,
                                       reconnect_time_wait=LOOK_RETRY, error_cb=quiet, **_auth(identity)),
                          reach, left=lambda late: quietly(late.close()))
    except Exception:  # noqa: BLE001 - not reached either: nothing to move to there
        return False
    try:
        return await answered(nc, ask)
    finally:
        await quietly(nc.close())


async def request_moving(nc: NATS, urls: list[str], subject: str, data: bytes, *, timeout: float, within: float,
                         name: str, identity: Identity | None, resend_after: float | None = None) -> Msg:
    """``nc.request`` for a one-shot client (a command): a request no one serves through ``nc``'s server ("no
    responders") took nothing, so it is sent again for ``within`` seconds -- and, when it is answered through
    another server of ``urls`` (a server cut from its cluster, alive, its services gone to the others), ``nc``
    moves there first. Then :class:`nats.errors.NoRespondersError`, as from ``nc.request``. With
    ``resend_after`` (a request safe to send twice), one unanswered that long, then twice as long, is sent
    again, for ``timeout`` in all."""
    loop = asyncio.get_running_loop()
    give_up, delay = loop.time() + within, 0.05

    async def ask(c: NATS) -> Msg:
        return await c.request(subject, data, timeout=timeout)

    async def sent() -> Msg:
        resends = Resends(timeout, resend_after, loop.time())
        while True:
            try:
                return await nc.request(subject, data, timeout=resends.timeout(loop.time()))
            except nats.errors.TimeoutError:
                if not resends.retry(loop.time()):
                    raise

    while True:
        try:
            return await sent()
        except nats.errors.NoRespondersError:
            if loop.time() + delay > give_up:
                raise
        if len(urls) < 2 or not await leave_if_cut_off(
                nc, urls, lambda url: answered_through(url, f"{name}-look", identity, ask),
                lambda: answered(nc, ask), lambda here, url: None):
            await asyncio.sleep(delay)  # (a service restarting, or taking over: a pause before asking again)
            delay = min(2 * delay, 1.0)


async def call_moving(nc: NATS, urls: list[str], subject: str, message: BaseModel, reply: type[M], *,
                      timeout: float, within: float, name: str, identity: Identity | None,
                      resend_after: float | None = None) -> M:
    """:func:`call` through :func:`request_moving`."""
    msg = await request_moving(nc, urls, subject, encode(message), timeout=timeout, within=within, name=name,
                               identity=identity, resend_after=resend_after)
    return parsed(msg.data, reply)


async def answered(nc: NATS, ask: Callable[[NATS], Awaitable[object]]) -> bool:
    """Whether ``ask`` over ``nc`` returns rather than raises (unanswered, refused, or the connection in
    trouble: what is asked is not reached through ``nc``'s server)."""
    try:
        await ask(nc)
    except Exception:  # noqa: BLE001 - any failure is "not answered here": the caller looks elsewhere
        return False
    return True


async def quietly(aw: Awaitable[object]) -> None:
    """Await ``aw`` for a step of closing, whatever it raises -- a CancelledError too, that nats-py raises from a
    connection the server reset (it cancels what waited on it) -- but a cancellation of the caller itself."""
    try:
        await aw
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling() > 0:
            raise
    except Exception:  # noqa: BLE001, S110 - closing goes on: what it closes ends either way
        pass


def _log_error(url: str) -> Callable[[Exception], Awaitable[None]]:
    async def on_error(e: Exception) -> None:
        log.warning("nats error", url=redact(url), error=f"{type(e).__name__}: {e}")

    return on_error


async def settled(nc: NATS, timeout: float = 10.0) -> None:
    """Until the server has taken everything written on ``nc`` so far: its subscriptions in force, its
    publishes received. ``nc.flush()`` alone is no such barrier: nats-py (2.16) writes its PING straight to
    the socket, ahead of the commands still in its buffer, so the PONG may come back before a subscription
    reaches the server. That first PING's flush has the writer put the buffer on the socket before the PONG
    can be read; a second PING follows it there, and its PONG comes after the server has everything.
    ``timeout`` bounds both (TimeoutError)."""
    async with asyncio.timeout(timeout):  # (not wait_for: its task would hide a single flush's race)
        for _ in range(2):
            await nc.flush()


async def shutdown(nc: NATS, timeout: float = 2.0) -> None:
    """Flush what was published, then close. (Not ``drain``: a pull subscription's unread messages hold a
    drain for its whole timeout, and a drain cut short can leave the socket open.)"""
    if nc.is_closed:
        return
    with contextlib.suppress(Exception):
        await settled(nc, timeout)
    with contextlib.suppress(Exception):
        await nc.close()


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


# What a message may be, checked before it is parsed: CooRM's own messages are far smaller (NATS refuses
# more than its max_payload, 1 MiB by default) and nest 6 levels at most (ViewsEpoch's steps)
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
MAX_DEPTH = 32
_OTHERS = bytes(b for b in range(256) if b not in b'"[]{}')  # all but quotes and brackets
_STRING = re.compile(rb'"[^"]*"')  # a string, once its escapes are gone: its brackets are not nesting
_SQUARE = bytes.maketrans(b"{}", b"[]")  # only the depth counts here; json.loads checks that pairs match


def _too_deep(data: bytes) -> bool:
    """Whether the JSON text nests deeper than :data:`MAX_DEPTH` (or its brackets do not pair), found at C
    speed without parsing it: ``json.loads`` recurses, and a deep enough message is a RecursionError."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False  # every message CooRM sends that is not a big batch
    # escaped backslashes, then escaped quotes, go first: what is left of a string is "..." without a quote
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _OTHERS)
    brackets = _STRING.sub(b"", text).translate(_SQUARE)
    too_deep = b"[" * (MAX_DEPTH + 1)
    for _ in range(MAX_DEPTH):  # each round takes the innermost level off every branch
        if too_deep in brackets:
            return True  # (the attack's usual shape: found at once)
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break  # no pair left to take: unbalanced
        brackets = inner
    return bool(brackets)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")  # NaN and Infinity: Python's extension, not JSON


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} does not fit a float")
    return value


def decode(data: bytes, model: type[M]) -> M:
    """Parse a message, turning every way it can be wrong into a :class:`WireError` that says why: not
    JSON (numbers too: finite ones only), too big, nested too deep, not the model."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(ErrorCode.BAD_MESSAGE, f"{len(data)} bytes: more than {MAX_MESSAGE_BYTES}")
    if _too_deep(data):
        raise WireError(ErrorCode.BAD_MESSAGE, f"not JSON nested {MAX_DEPTH} levels deep at most")
    try:
        raw = json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise WireError(ErrorCode.BAD_MESSAGE, f"not JSON: {e}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise WireError(ErrorCode.BAD_MESSAGE, f"not a valid {model.__name__}: {_problems(e)}") from None


def _problems(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or '(message)'}: {err['msg']}" for err in e.errors()[:5])


Handler = Callable[[M, Msg], Awaitable[BaseModel | None]]


_running: set[asyncio.Task] = set()
_ID = TypeAdapter(Identifier)


def _check_ids(pattern: str, subject: str) -> None:
    """The tokens of ``subject`` that the wildcards of ``pattern`` matched must be ids: a client may publish
    to ``app.>.views`` or ``app.é.request``, and the handler would take that for an application's id."""
    tokens = subject.split(".")
    for i, wild in enumerate(pattern.split(".")):
        matched = tokens[i:] if wild == ">" else tokens[i:i + 1] if wild == "*" else []
        for token in matched:
            try:
                _ID.validate_python(token)
            except ValidationError:
                raise WireError(ErrorCode.BAD_REQUEST, f"not an id in the subject: {token!r}") from None


async def serve(nc: NATS, subject: str, model: type[M], handler: Handler, *, queue: str = "",
                concurrent: bool = False, fast: Callable[[Msg], bytes | None] | None = None):
    """Subscribe ``handler`` to ``subject``: it gets the parsed message and returns the reply model (or None
    for a publish that expects no reply). Every request gets a reply, never silence: a :class:`WireError`
    becomes an ``ErrorReply``; so does an id of the subject that is not one and a pydantic model that the
    handler builds from what it was sent refusing a value (code ``bad_request``); any other exception too
    (code ``unavailable``), logged; and a reply too big to send.

    A subscription's messages are handled one after the other; with ``concurrent`` each gets its own task,
    so that a handler waiting on I/O does not hold the next (callers that need an order wait for replies).
    ``fast``: a first look at each message, for a subject that carries thousands a second of one plain kind
    (heartbeats): the reply's bytes when the message is that kind's common, valid case, else None -- and then
    the message takes the path above, which answers everything else (a refusal with its code) as before.
    It returns once the server has the subscription."""
    # only servers serve: a launcher importing this module registers no Prometheus metrics
    from coorm.shared import metrics

    has_ids = any(token in ("*", ">") for token in subject.split("."))

    async def on_msg(msg: Msg) -> None:
        if fast is not None:
            data = fast(msg)
            if data is not None:
                received(msg.subject).inc()
                if msg.reply:
                    await nc.publish(msg.reply, data)
                return
        if concurrent:
            task = asyncio.create_task(handle(msg))
            _running.add(task)
            task.add_done_callback(_running.discard)
        else:
            await handle(msg)

    async def answer(msg: Msg) -> BaseModel | None:
        try:
            if has_ids:
                _check_ids(subject, msg.subject)
            return await handler(decode(msg.data, model), msg)
        except WireError as e:
            return e.reply()
        except ValidationError as e:
            # a model the handler built from what it was sent refuses a value: the request's fault
            log.warning("a model refused what the handler was sent", subject=msg.subject, model=e.title)
            return WireError(ErrorCode.BAD_REQUEST, f"refused by {e.title}: {_problems(e)}").reply()
        except Exception as e:  # noqa: BLE001 - a reply must go out whatever went wrong
            log.exception("handler failed", subject=msg.subject)
            return WireError(ErrorCode.UNAVAILABLE, f"internal error: {type(e).__name__}: {e}").reply()

    counters: dict[str, Any] = {}

    def received(subject: str) -> Any:
        verb = subjects.verb_of(subject)
        counter = counters.get(verb)
        if counter is None:  # (a label's child, looked up once: a lookup per message was a cost of its own)
            counter = metrics.messages_received.labels(verb)
            if len(counters) < 64:
                counters[verb] = counter
        return counter

    async def handle(msg: Msg) -> None:
        received(msg.subject).inc()
        out = await answer(msg)
        if isinstance(out, ErrorReply):
            metrics.error_replies.labels(out.error.code.value).inc()
        if msg.reply and out is not None:
            await _respond(nc, msg, out)

    sub = await nc.subscribe(subject, queue=queue, cb=on_msg)
    # in force on the server when this returns: a service that says it is ready answers the next request
    # (else a request sent at once may find no responder while the subscription is still on its way)
    await settled(nc)
    return sub


async def _respond(nc: NATS, msg: Msg, out: BaseModel) -> None:
    """Send the reply; one that cannot be encoded or is too big for the server goes out as an error."""
    try:
        data = encode(out)
    except Exception as e:  # noqa: BLE001 - a reply must go out
        log.exception("reply not encodable", subject=msg.subject)
        data = encode(WireError(ErrorCode.UNAVAILABLE, f"internal error: the reply cannot be encoded: {e}").reply())
    if len(data) > nc.max_payload:
        data = encode(WireError(ErrorCode.UNAVAILABLE, f"internal error: the reply is {len(data)} bytes, more than "
                                                       f"the server's {nc.max_payload}").reply())
    try:
        await msg.respond(data)
    except nats.errors.Error as e:  # the connection is closing: nothing to reply on
        log.warning("reply not sent", subject=msg.subject, error=str(e))


async def call(nc: NATS, subject: str, message: BaseModel, reply: type[M], *, timeout: float = 5.0,
               signer: Identity | None = None) -> M:
    """Request/reply: the parsed reply, or :class:`WireError` if the other side refused. With ``signer``,
    the message carries its signature (``credentials.signature_headers``)."""
    data = encode(message)
    headers = None
    if signer is not None:
        from coorm.shared.credentials import signature_headers

        headers = signature_headers(signer, subject, data)
    msg = await nc.request(subject, data, timeout=timeout, headers=headers)
    return parsed(msg.data, reply)


def parsed(data: bytes, reply: type[M]) -> M:
    """A reply's payload as ``reply``, or :class:`WireError` if it is an error reply."""
    raw = json.loads(data)
    if isinstance(raw, dict) and raw.get("ok") is False:
        err = ErrorReply.model_validate(raw).error
        raise WireError(err.code, err.message)
    return reply.model_validate(raw)


# ================================================================================================
# JetStream consumers: poison messages
# ================================================================================================
MAX_DELIVERIES = 5  # a stream message that failed this many deliveries is set aside
RETRY_DELAY = 0.25  # seconds before its next delivery, doubled each time (0.25, 0.5, 1, 2)
DEAD_LETTER_DATA = 64 * 1024  # bytes of the message a dead letter quotes (escaped, it still fits a message)


async def set_aside(nc: NATS, msg: Msg, error: str) -> None:
    """Dead-letter a stream message: a :class:`~coorm.shared.protocol.DeadLetter` on
    ``subjects.deadletter(<its stream>)``, counted (``coorm_dead_letters_total``) and logged once, then
    terminated so that JetStream never delivers it again -- at its first delivery when it can never be
    processed (not a valid message), through :func:`retry_or_set_aside` when it keeps failing."""
    from coorm.shared import metrics

    meta = msg.metadata
    error = _bounded(error)
    letter = DeadLetter(stream=meta.stream, consumer=meta.consumer, sequence=meta.sequence.stream,
                        subject=msg.subject, deliveries=meta.num_delivered, error=error, size=len(msg.data),
                        data=msg.data[:DEAD_LETTER_DATA].decode(errors="replace"))
    try:
        await nc.publish(subjects.deadletter(meta.stream), encode(letter))
    except Exception as e:  # noqa: BLE001 - terminated all the same: it must not come back for ever
        log.warning("dead letter not published", stream=meta.stream, error=f"{type(e).__name__}: {e}")
    metrics.dead_letters.labels(meta.stream).inc()
    log.warning("stream message set aside", stream=meta.stream, consumer=meta.consumer, seq=meta.sequence.stream,
                deliveries=meta.num_delivered, error=error)
    with contextlib.suppress(nats.errors.Error):  # the connection is going: it comes again, and goes here again
        await msg.term()


async def retry_or_set_aside(nc: NATS, msg: Msg, error: BaseException) -> None:
    """After a delivery that failed: deliver the message again later (a nak with back-off), or set it aside
    once it failed :data:`MAX_DELIVERIES` deliveries. (A consumer that waits for an unreachable server
    naks by itself instead: that is no fault of the message.)"""
    n = msg.metadata.num_delivered
    why = f"{type(error).__name__}: {error}"
    if n >= MAX_DELIVERIES:
        await set_aside(nc, msg, f"failed {n} deliveries, the last with {why}")
        return
    # the traceback once, with the first failure
    log.warning("stream message not processed: it comes again", stream=msg.metadata.stream,
                seq=msg.metadata.sequence.stream, delivery=n, error=why, exc_info=error if n == 1 else None)
    with contextlib.suppress(nats.errors.Error):
        await msg.nak(delay=RETRY_DELAY * 2 ** (n - 1))
