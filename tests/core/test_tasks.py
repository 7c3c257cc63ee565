"""shared/tasks.cancelled: a task that swallows its cancellation -- as Python 3.11's ``wait_for`` does when
the awaited reply lands with it, under every nats-py request -- is ended all the same."""

from __future__ import annotations

import asyncio

import pytest

from coorm.shared.tasks import cancelled

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
