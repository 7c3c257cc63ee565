"""Ending asyncio tasks for sure.

Python 3.11's ``asyncio.wait_for`` -- under every nats-py request and flush -- drops a cancellation that
comes as the awaited reply lands: the task goes on as if never cancelled, and a clean-up that cancelled it
once and awaited it waited for ever (a node agent stopping while its heartbeat's answer came in, a policy
engine's term ending while a publish flushed). What must end is cancelled again until it has.
"""

from __future__ import annotations

import asyncio
import contextlib

AGAIN_AFTER = 0.5  # s between cancellations of a task that swallowed one


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
