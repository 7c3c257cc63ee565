"""Heartbeats held to a rate: with more sessions than ``heartbeat_rate`` allows at the base interval, the
policy engine tells every paced session to beat less often (in each heartbeat's answer) and reaps later;
with fewer again, the pace falls back one step at a time. Real nats-server and Valkey, real SDK sessions;
the leading engine a real process, SIGKILLed just after most sessions closed, while the survivors still beat
at the slow pace: its standby must not reap them (it starts from the pace its predecessor stored)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from coorm.launchers.sdk import Session
from coorm.services.stack import wait_until
from coorm.shared import bus, keys, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import HeartbeatMsg, SessionOpen, SessionOpenReply
from tests.live.leaders import leader_and_standby
from tests.live.roles import ME
from tests.live.test_system import _settings

BASE, TIMEOUT, RATE, LONGEST = 0.2, 0.6, 5.0, 2.0  # 8 sessions: 1.6 s between beats (8 / 1.6 = 5 a second)


async def test_many_sessions_beat_less_often_are_not_reaped_for_it_and_a_new_leader_knows(servers, redis_url,
                                                                                         tmp_path):
    settings = _settings(servers, leader_lease=1.0, launcher_heartbeat=BASE, session_timeout=TIMEOUT,
                         heartbeat_rate=RATE, heartbeat_longest=LONGEST)
    env = dict(COORM_LEADER_LEASE="1.0", COORM_LAUNCHER_HEARTBEAT=str(BASE), COORM_SESSION_TIMEOUT=str(TIMEOUT),
               COORM_HEARTBEAT_RATE=str(RATE), COORM_HEARTBEAT_LONGEST=str(LONGEST),
               COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    async with leader_and_standby(servers, settings, env) as pair:
        tap = await bus.connect(settings.nats_url, "tap", settings.identity(Role.SERVICE))
        beats: dict[str, list[float]] = defaultdict(list)

        async def heard(msg) -> None:
            beats[subjects.app_of(msg.subject)].append(time.monotonic())

        await tap.subscribe(subjects.APP_HEARTBEAT_ANY, cb=heard)
        await bus.settled(tap)
        sessions = [await Session.open(settings, kind="rigid", views=False) for _ in range(8)]
        try:
            # the first opened at the base pace, the last at the pace of 8: every one is told it as it beats
            assert (sessions[0].reply.heartbeat_interval, sessions[-1].reply.heartbeat_interval) == (BASE, 1.6)
            assert sessions[-1].reply.session_timeout == 4.8
            await wait_until(lambda: all(s.reply.heartbeat_interval == 1.6 for s in sessions), 10,
                             "every session told to beat every 1.6 s")
            assert pair.redis.get(keys.HEARTBEAT_LEVEL) == "3"

            # a launcher that did not ask to be paced is told the base pace, and answered the plain Ack
            other = await bus.connect(settings.nats_url, "unpaced", settings.identity(Role.LAUNCHER))
            reply = await bus.call(other, subjects.session_open(ME), SessionOpen(), SessionOpenReply, timeout=5)
            assert (reply.heartbeat_interval, reply.session_timeout) == (BASE, TIMEOUT)
            answer = await other.request(reply.subjects.heartbeat, bus.encode(HeartbeatMsg(token=reply.token)),
                                         timeout=5)
            assert answer.data == b'{"ok":true,"requests":[]}'
            await bus.shutdown(other)  # (reaped: it beats no more)

            # each beats every 1.6 s, far past the base timeout, and none is reaped for it
            mark = time.monotonic()
            await wait_until(lambda: all(sum(t > mark for t in beats[s.app]) >= 3 for s in sessions), 20,
                             "three beats of every session")
            since = [[t for t in beats[s.app] if t > mark] for s in sessions]
            gaps = [b - a for ts in since for a, b in zip(ts, ts[1:], strict=False)]
            assert min(gaps) > 1.4, gaps
            assert not any(s.closed for s in sessions)

            # most close; the leader dies before the pace may fall (a fall waits 1.6 s): the survivors still
            # beat every 1.6 s, which a leader starting at the pace of 2 sessions (0.4 s) would reap at 1.2 s
            for s in sessions[2:]:
                await s.close()
            pair.kill_leader()
            await asyncio.wait_for(pair.standby.leader.wait(), 15)
            await wait_until(lambda: all(s.reply.heartbeat_interval == 0.4 for s in sessions[:2]), 20,
                             "the pace fallen back to that of 2 sessions")
            assert not any(s.closed for s in sessions[:2])
            assert {s.app for s in sessions[:2]} <= set(pair.standby.sessions)
        finally:
            for s in sessions:
                await bus.quietly(s.close())
            await bus.shutdown(tap)
