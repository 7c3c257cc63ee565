"""A session's event queue: every event in order, except that views not read yet give way to newer ones, so
that an application that does not read its events does not hold every ``changeNotify`` it was sent."""

from __future__ import annotations

import asyncio

from coorm.launchers.base import Views
from coorm.launchers.sdk import Started, ViewsChanged, _EventQueue


def _views(epoch: int, size: int = 10) -> ViewsChanged:
    return ViewsChanged(Views(float(epoch), {}, {}), epoch, size)


def test_unread_views_give_way_to_newer_ones_and_other_events_keep_their_place():
    q = _EventQueue()
    for e in (1, 2, 3):
        q.put_nowait(_views(e))
    started = Started("r1", "c0", ("n0",), (), None)
    q.put_nowait(started)
    q.put_nowait(_views(4, 7))
    q.put_nowait(_views(5, 8))
    got = [q.get_nowait() for _ in range(q.qsize())]
    assert [type(e).__name__ for e in got] == ["ViewsChanged", "Started", "ViewsChanged"]
    assert (got[0].epoch, got[0].bytes) == (3, 30)  # the latest, with the bytes of those it replaced
    assert got[1] is started
    assert (got[2].epoch, got[2].bytes) == (5, 15)
    assert q.empty()


def test_a_thousand_unread_views_take_one_place_and_a_reader_waiting_gets_the_next():
    async def main() -> None:
        q = _EventQueue()
        for e in range(1000):
            q.put_nowait(_views(e))
        assert q.qsize() == 1
        assert (await q.get()).epoch == 999
        reader = asyncio.create_task(q.get())
        await asyncio.sleep(0)  # (a turn of the loop: the reader runs until it waits on the empty queue)
        assert not reader.done()
        q.put_nowait(_views(1000))
        assert (await asyncio.wait_for(reader, 5)).epoch == 1000

    asyncio.run(main())
