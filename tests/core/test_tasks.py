"""shared/tasks.cancelled: a task that swallows its cancellation -- as Python 3.11's ``wait_for`` does when
the awaited reply lands with it, under every nats-py request -- is ended all the same. shared/tasks.within:
a caller that is cancelled or times out leaves at once, and what it waited on is read when it ends."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import pytest

from coorm.shared.tasks import cancelled, within

BOUND = 10.0  # s: a test that would hang fails instead


async def test_a_task_that_swallows_its_first_cancellation_is_cancelled_again():
    swallowed = asyncio.Event()

    async def beating() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.set()  # goes on, as if never cancelled: one cancel() and an await would wait for ever
        await asyncio.Event().wait()

    task = asyncio.create_task(beating())
    await asyncio.sleep(0)  # (the task runs up to its first wait)
    async with asyncio.timeout(BOUND):
        await cancelled(task)
    assert swallowed.is_set() and task.cancelled()


async def test_a_reply_that_lands_with_the_cancellation_does_not_keep_the_task_going():
    """The real thing: a request whose answer comes in the same turn of the loop as the cancellation."""
    loop = asyncio.get_running_loop()
    answers: list[asyncio.Future] = []
    got = 0

    async def heartbeat() -> None:
        nonlocal got
        while True:
            answers.append(loop.create_future())
            await asyncio.wait_for(answers[-1], 60)
            got += 1

    task = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    answers[-1].set_result(None)
    async with asyncio.timeout(BOUND):
        await cancelled(task)
    assert task.done() and got <= 2


async def test_what_the_tasks_raised_is_raised_after_every_one_ended():
    async def failing() -> None:
        raise ValueError("its own failure")

    other = asyncio.create_task(asyncio.Event().wait())
    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="its own failure"):
        await cancelled(task, other)
    assert other.cancelled()


async def test_the_callers_own_cancellation_is_not_swallowed():
    stubborn, done = asyncio.Event(), asyncio.Event()

    async def ends_only_when_told() -> None:
        while not done.is_set():
            try:
                await done.wait()
            except asyncio.CancelledError:
                stubborn.set()

    task = asyncio.create_task(ends_only_when_told())
    await asyncio.sleep(0)
    caller = asyncio.create_task(cancelled(task))
    await stubborn.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    done.set()
    await task


def _unread_exceptions() -> list[dict]:
    """What the loop is told of a task whose exception nobody read (collected, so told now)."""
    seen: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: seen.append(context))
    return seen


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    gc.collect()  # (a task's unread exception is reported when the task is collected)
    await asyncio.sleep(0)


async def test_a_caller_cancelled_leaves_at_once_and_what_it_waited_on_is_read_when_it_ends():
    """What nats-py's connect does under Python 3.11: its cancellation swallowed by a ``wait_for`` inside (the
    first test above), it goes on -- here until its caller has left -- and ends with its own error.
    ``asyncio.wait_for`` held the cancelled caller until then (here: for ever) and left the error unread;
    ``within`` does neither."""
    seen = _unread_exceptions()
    caller_left, ended = asyncio.Event(), asyncio.Event()

    async def connecting() -> str:
        try:
            while not caller_left.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await caller_left.wait()
            raise ConnectionError("no servers")  # (as nats-py's NoServersError)
        finally:
            ended.set()

    task = asyncio.create_task(within(connecting(), 30))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # (connecting waits)
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=BOUND)
        assert task.cancelled()  # at once: not when connecting ends
        assert not ended.is_set()
    finally:
        caller_left.set()  # (connecting ends: a failure does not hang the run)
    async with asyncio.timeout(BOUND):
        await ended.wait()
    await _settle()
    assert not [c for c in seen if "never retrieved" in c.get("message", "")], seen


async def test_what_succeeds_after_its_caller_left_is_handed_to_left_and_a_timeout_is_a_timeout():
    seen = _unread_exceptions()
    let_go: list[str] = []
    stall = asyncio.Event()

    async def connected() -> str:
        try:
            await stall.wait()
        except asyncio.CancelledError:
            pass  # (goes on, and connects all the same)
        return "connection"

    async def close(connection: str) -> None:
        let_go.append(connection)

    with pytest.raises(TimeoutError):
        await within(connected(), 0.05, left=close)
    async with asyncio.timeout(BOUND):
        while not let_go:
            await asyncio.sleep(0.01)
    assert let_go == ["connection"]
    assert await within(asyncio.sleep(0, result=7), 1) == 7
    with pytest.raises(ValueError, match="its own"):
        await within(_raises(), 1)
    await _settle()
    assert not seen, seen


async def _raises() -> None:
    raise ValueError("its own failure")
