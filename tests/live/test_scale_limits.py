"""Ten thousand live requests: every reply and every decision message stays below the server's max payload
(before, ``coorm status`` failed past 10,000 requests and the engine aborted a batch it had logged, with
``MaxPayloadError``, when a session with that many requests closed)."""

from __future__ import annotations

import pytest

from coorm.cli.live import _status
from coorm.launchers.sdk import Session
from coorm.services.stack import LocalStack, wait_until
from coorm.shared.requests import RequestSpec
from tests.live.test_system import _settings

N = 10_000


@pytest.fixture
async def stack(servers, redis_url):
    async with LocalStack(_settings(servers, reschedule_interval=0.2), {"c0": 4}) as s:
        yield s


async def test_ten_thousand_requests_page_and_end_without_exceeding_a_message(stack):
    app = await Session.open(stack.settings, kind="rigid")
    try:
        for first in range(0, N, 1000):  # (one batch of 10,000 would itself exceed a message)
            await app.request(*(RequestSpec(id=app.rid(str(i)), type="non-preemptible", cluster="c0", nodes=1,
                                            duration=3600) for i in range(first, first + 1000)))
        await wait_until(lambda: sum(r.state.value == "started" for r in stack.engine.cores.policy.requests.values())
                         == 4, 30, "the first pass over them")
        st = await _status(stack.settings)
        assert (st.total_requests, st.running, st.waiting) == (N, 4, N - 4)
        assert len({r.request for r in st.requests}) == N and len(st.requests) == N
        counts = await _status(stack.settings, everything=False)
        assert (counts.total_requests, counts.apps, counts.requests) == (N, [], [])
    finally:
        await app.close()  # ends 10,000 requests in one event: its decisions go out in several messages
    await wait_until(lambda: not stack.engine.cores.policy.requests, 60, "every request to end")
    assert stack.engine.leader.is_set() and not stack.parts["policy-engine"].task.done()
    async with await Session.open(stack.settings, kind="rigid") as after:  # the engine goes on serving
        (rid,) = await after.request(RequestSpec(id=after.rid("after"), type="non-preemptible", cluster="c0",
                                                 nodes=4, duration=60))
        start = await after.wait_start(rid, 30)
        assert len(start.nodes) == 4
