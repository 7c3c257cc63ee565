"""Ending asyncio tasks for sure.

Python 3.11's ``asyncio.wait_for`` -- under every nats-py request and flush -- drops a cancellation that
comes as the awaited reply lands: the task goes on as if never cancelled, and a clean-up that cancelled it
once and awaited it waited for ever (a node agent stopping while its heartbeat's answer came in, a policy
engine's term ending while a publish flushed). What must end is cancelled again until it has.

The same ``wait_for``, cancelled, waits for what it waited on to finish being cancelled -- for as long as that
swallows the cancellation and goes on -- and then leaves what it ended with unread. :func:`within` lets go
of it instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

AGAIN_AFTER = 0.5  # s between cancellations of a task that swallowed one
T = TypeVar("T")
# what callers that left no longer wait for, until it ends (the loop keeps only a weak reference to a task)
_LET_GO: set[asyncio.Future] = set()


async def cancelled(*tasks: asyncio.Task) -> None:
    """Cancel ``tasks`` and wait until every one ended, cancelling again what goes on. Raises the first
    exception a task ended with, but a cancellation; the caller's own cancellation is not swallowed."""
    while pending := [t for t in tasks if not t.done()]:
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=AGAIN_AFTER)
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def within(aw: Awaitable[T], seconds: float, *, left: Callable[[T], Awaitable[object]] | None = None) -> T:
    """``aw`` given ``seconds`` (then ``TimeoutError``), as ``asyncio.wait_for``, but a caller that is cancelled
    or times out leaves at once. ``aw`` is cancelled and let go of: what it ends with is read when it does (an
    exception dropped: a nats-py connect that went on after its cancellation ends with ``NoServersError``,
    which ``wait_for`` left unread -- "Task exception was never retrieved"), a result given to ``left`` (a
    connection made after its caller left, to be closed)."""
    task = asyncio.ensure_future(aw)
    try:
        return await asyncio.wait_for(asyncio.shield(task), seconds)
    except BaseException:
        if not task.done():
            task.cancel()
        _LET_GO.add(task)
        task.add_done_callback(lambda t: _dropped(t, left))
        raise


def _dropped(task: asyncio.Future[T], left: Callable[[T], Awaitable[object]] | None) -> None:
    _LET_GO.discard(task)
    if task.cancelled() or task.exception() is not None or left is None:
        return
    closing = asyncio.ensure_future(left(task.result()))
    _LET_GO.add(closing)
    closing.add_done_callback(_LET_GO.discard)
