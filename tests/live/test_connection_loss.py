"""A launcher and CooRM's NATS: the first connection is bounded, a restart of the server within the
reconnect window goes unnoticed, and a server gone for good ends every wait with a clear error (and a
launcher run with no exit code of success)."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from coorm.launchers.live import LiveRunner
from coorm.launchers.rigid import RigidLauncher
from coorm.launchers.sdk import Closed, Session
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus
from coorm.shared.requests import RequestSpec
from coorm.shared.servers import free_port, start_servers
from coorm.shared.settings import Settings


def _settings(nats_url: str, redis_url: str, **kw) -> Settings:
    base = dict(nats_url=nats_url, redis_url=redis_url, reschedule_interval=0.05, fair_start=0.1,
                launcher_heartbeat=0.2, session_timeout=30.0, agent_heartbeat=0.2, agent_timeout=30.0,
                kill_grace=0.3, connect_timeout=1.0, reconnect_window=1.5)
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def own_servers(tmp_path, monkeypatch):
    """Servers of this test alone: it kills and restarts its nats-server."""
    s = start_servers(tmp_path / "servers")
    monkeypatch.setenv("COORM_CREDENTIALS_DIR", str(s.credentials))  # each Settings finds its identity there
    yield s
    s.stop()


def _kill_nats(servers) -> None:
    nats = servers.procs[0]
    nats.kill()
    nats.wait(timeout=10)


def _restart_nats(servers) -> None:
    """The same command again: same port, store and users."""
    proc = subprocess.Popen(list(servers.procs[0].args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    servers.procs[0] = proc


async def test_opening_a_session_gives_up_after_the_connect_timeout():
    settings = Settings(nats_url=f"nats://127.0.0.1:{free_port()}", connect_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(bus.Unreachable) as e:
        await Session.open(settings, kind="rigid")
    assert time.monotonic() - t0 < 3
    assert settings.nats_url in str(e.value) and "coorm up" in str(e.value)


async def test_a_server_restart_within_the_window_keeps_the_session(own_servers):
    settings = _settings(own_servers.nats_url, own_servers.redis_url, reconnect_window=30.0)
    async with LocalStack(settings, {"c0": 2}) as stack:
        await stack.wait_nodes_up()
        s = await Session.open(settings, kind="rigid")
        try:
            _kill_nats(own_servers)
            # a request sent before the client notices the loss is lost with the server (and times out):
            # ask once the client has noticed and reconnected
            await wait_until(lambda: not s.nc.is_connected, what="the client notices the loss")
            _restart_nats(own_servers)
            await wait_until(lambda: s.nc.is_connected, timeout=20, what="the client reconnects")
            info = await asyncio.wait_for(s.clusters_info(), 30)
            assert [c.id for c in info.clusters] == ["c0"]
            assert s.lost is None and not s.closed
        finally:
            await s.close()


async def test_a_server_gone_for_good_ends_every_wait_with_an_error(own_servers):
    settings = _settings(own_servers.nats_url, own_servers.redis_url)
    async with LocalStack(settings, {"c0": 2}) as stack:
        await stack.wait_nodes_up()
        s = await Session.open(settings, kind="rigid")
        (rid,) = await s.request(RequestSpec(id=s.rid("big"), cluster="c0", nodes=2, duration=600))
        await s.wait_start(rid, timeout=10)
        never = RequestSpec(id=s.rid("never"), cluster="c0", nodes=2, duration=600)  # waits behind "big"
        (waiting,) = await s.request(never)
        start_wait = asyncio.create_task(s.wait_start(waiting))
        exits_wait = asyncio.create_task(s.wait_exits(rid, 1))
        t0 = time.monotonic()
        _kill_nats(own_servers)
        for wait in (start_wait, exits_wait):
            with pytest.raises(bus.Unreachable) as e:
                await asyncio.wait_for(wait, 30)
            assert e.value.lost and "lost CooRM" in str(e.value)
        assert time.monotonic() - t0 < 20
        events = []
        while not s._events.empty():
            events.append(s._events.get_nowait())
        assert isinstance(events[-1], Closed) and events[-1].error is s.lost
        with pytest.raises(bus.Unreachable):
            await s.done(rid)
        await asyncio.wait_for(s.close(), 5)  # returns at once: nothing left to tell


async def test_a_launcher_run_that_loses_coorm_fails_instead_of_succeeding(own_servers):
    settings = _settings(own_servers.nats_url, own_servers.redis_url)
    async with LocalStack(settings, {"c0": 2}) as stack:
        await stack.wait_nodes_up()
        s = await Session.open(settings, kind="rigid")
        runner = LiveRunner(s, RigidLauncher(s.app, "c0", 1, 600), command=["sleep", "600"],
                            command_ends_work=True)
        run = asyncio.create_task(runner.run())
        await s.wait_start(f"{s.app}.1", timeout=10)  # the launcher's first request: its job is running
        _kill_nats(own_servers)
        with pytest.raises(bus.Unreachable):
            await asyncio.wait_for(run, 30)
        assert runner.result.exit_code == 0  # what run() would have returned, had it not raised
