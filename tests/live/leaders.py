"""A policy engine leader that can be SIGKILLed, and its standby: the leader a real process in a session of its
own (``coorm service policy-engine``: no goodbye when it is killed, its lease in Redis lapses), the standby a
:class:`PolicyEngine` in this process, started once the leader holds the lease so that it waits as a standby."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis

from coorm.services.policy_engine.service import PolicyEngine
from coorm.services.stack import wait_until
from coorm.shared import keys
from coorm.shared.settings import Settings


@dataclass
class LeaderAndStandby:
    leader: subprocess.Popen
    standby: PolicyEngine
    redis: redis.Redis

    def kill_leader(self) -> None:
        """SIGKILL the leader's process group (once: a second call finds it gone)."""
        if self.leader.poll() is None:
            os.killpg(self.leader.pid, signal.SIGKILL)
        self.leader.wait()


@asynccontextmanager
async def leader_and_standby(servers, settings: Settings, env: dict[str, str]) -> AsyncIterator[LeaderAndStandby]:
    """``env``: the leader's ``COORM_*`` variables beyond the servers' URLs (its lease, intervals, connection
    file), to match ``settings``, which the standby runs with. On exit the leader's group is killed if it
    lives, the standby stopped, the Redis client closed."""
    env = dict(os.environ, COORM_NATS_URL=servers.nats_url, COORM_REDIS_URL=servers.redis_url, **env)
    leader = subprocess.Popen([sys.executable, "-m", "coorm.cli.main", "service", "policy-engine"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    r = redis.Redis.from_url(servers.redis_url, decode_responses=True)
    pair = LeaderAndStandby(leader, PolicyEngine(settings, instance="standby"), r)
    stop_standby = asyncio.Event()
    standby_task = None
    try:
        await wait_until(lambda: r.get(keys.POLICY_LEASE) is not None, timeout=20, what="the leader's lease")
        standby_task = asyncio.create_task(pair.standby.run(stop_standby))
        yield pair
    finally:
        pair.kill_leader()
        stop_standby.set()
        if standby_task is not None:
            await asyncio.wait_for(standby_task, 10)
        r.close()
