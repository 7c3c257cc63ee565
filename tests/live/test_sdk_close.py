"""``Session.close`` on a connection the server dropped: it returns (the RMS reaps a session it did not hear
close), never with a CancelledError that is not the caller's own -- nats-py cancels what waits on a
connection it closes, and one 300-application ``bench_ha.py`` run had such a CancelledError end an
application -- while a cancellation of the caller itself still ends the close. Real nats-server, SIGKILLed.
And what still waits on a session its application closes ends at once (a real stack, a real agent)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from coorm.launchers.sdk import CALL_TIMEOUT, Session, SessionClosed
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import SessionOpenReply, SessionSubjects
from coorm.shared.servers import start_servers
from coorm.shared.settings import Settings
from tests.live.roles import ME
from tests.live.test_system import rq, stack  # noqa: F401 - the fixture

APP = subjects.app_id(ME, 1)


def _reply() -> SessionOpenReply:
    return SessionOpenReply(app=APP, token="t", heartbeat_interval=60.0, subjects=SessionSubjects(
        request=subjects.app_request(APP), done=subjects.app_done(APP), close=subjects.app_close(APP),
        heartbeat=subjects.app_heartbeat(APP), change=subjects.notify_change(APP), start=subjects.notify_start(APP),
        kill=subjects.notify_kill(APP)))


async def _session(settings: Settings) -> tuple[Session, asyncio.Queue]:
    """A session of its own connection (as ``Session.open`` makes it), and what the "policy engine" gets on
    its close subject (it never answers)."""
    engine = await bus.connect(settings.nats_url, "engine", settings.identity(Role.SERVICE))
    closes: asyncio.Queue = asyncio.Queue()

    async def on_close(msg) -> None:
        closes.put_nowait(msg)

    await engine.subscribe(subjects.app_close(APP), cb=on_close)
    await bus.settled(engine)
    nc = await bus.connect_client(settings.nats_url, "app", timeout=3.0, reconnect_window=settings.reconnect_window,
                                  identity=settings.identity(Role.LAUNCHER))
    s = Session(nc=nc, reply=_reply(), settings=settings, own_connection=True, with_views=False)
    await s._subscribe()
    s._engine = engine  # type: ignore[attr-defined]
    return s, closes


def test_close_returns_when_the_server_drops_the_connection_and_a_cancelled_close_ends(tmp_path):
    with start_servers(tmp_path / "servers") as servers:
        settings = Settings(nats_url=servers.nats_url, credentials_dir=servers.credentials, reconnect_window=1.0)

        async def scenario() -> None:
            # a close cancelled by its caller ends with the caller's CancelledError, at once
            s, closes = await _session(settings)
            closing = asyncio.create_task(s.close())
            await asyncio.wait_for(closes.get(), 10)
            closing.cancel()
            done, _ = await asyncio.wait({closing}, timeout=5)
            assert done and closing.cancelled()
            await bus.shutdown(s._engine)
            await s.nc.close()
            # the server dies under a close in flight: the close returns, whatever nats-py raised
            s, closes = await _session(settings)
            closing = asyncio.create_task(s.close())
            await asyncio.wait_for(closes.get(), 10)
            os.kill(servers.procs[0].pid, signal.SIGKILL)
            servers.procs[0].wait()
            await asyncio.wait_for(closing, 20)  # raises if close raised anything
            assert s.closed and s.nc.is_closed
            await s._engine.close()

        asyncio.run(scenario())


def test_a_launcher_cancelled_still_tells_the_rms_its_session_closes(tmp_path):
    """A launcher task cancelled (a user stopping it) closes its session in its clean-up: the close reaches the
    RMS. It did not when the heartbeat's own CancelledError, raised while the task was being cancelled, was
    taken for the caller's: the session kept its nodes until it was reaped."""
    with start_servers(tmp_path / "servers") as servers:
        settings = Settings(nats_url=servers.nats_url, credentials_dir=servers.credentials, reconnect_window=1.0)

        async def scenario() -> None:
            s, closes = await _session(settings)
            s._heartbeat = asyncio.create_task(s._beat())  # (as Session.open starts it)
            running = asyncio.Event()

            async def launcher() -> None:
                try:
                    running.set()
                    await asyncio.Event().wait()  # its work, until it is stopped
                finally:
                    await s.close()

            task = asyncio.create_task(launcher())
            await running.wait()
            task.cancel()
            msg = await asyncio.wait_for(closes.get(), 10)  # the close went out, from the cancelled task's clean-up
            assert msg.subject == subjects.app_close(APP)
            task.cancel()  # (the engine here never answers: the close's wait for it ends with this cancel)
            await asyncio.wait({task}, timeout=10)
            assert task.done()
            await bus.shutdown(s._engine)
            await s.nc.close()

        asyncio.run(scenario())


async def test_what_waits_on_a_session_its_application_closes_ends_at_once(stack):  # noqa: F811
    """Launches in flight, a start that will not come and the exits of a launch as the application closes its
    session end with :class:`SessionClosed` -- not after the call's timeout: the launches waited their whole
    5 s for an answer the closed connection could not bring (a PSA growing as the twin's runs ended), and a
    ``wait_start`` without a timeout waited for ever."""
    app = await Session.open(stack.settings, kind="psa")
    (rid,) = await app.request(rq("grown", "c0", 8, None, type="preemptible"))
    start = await app.wait_start(rid, 20)
    (holder,) = await app.request(rq("holder", "c1", 8, 60))
    await app.wait_start(holder, 20)
    (never,) = await app.request(rq("never", "c1", 8, 60))  # behind the holder for a minute
    launches = [asyncio.create_task(app.launch(rid, n, ["sleep", "100"])) for n in start.nodes]
    waiting = asyncio.create_task(app.wait_start(never))
    exits = asyncio.create_task(app.wait_exits(rid, len(start.nodes)))
    await asyncio.sleep(0)  # (the launches go out: they are in flight as the session closes)
    await app.close()
    ended = await asyncio.wait_for(asyncio.gather(*launches, waiting, exits, return_exceptions=True),
                                   CALL_TIMEOUT / 2)
    assert all(isinstance(e, (SessionClosed, list)) for e in ended[:-2]), ended  # (a launch may have won)
    assert isinstance(ended[-2], SessionClosed) and isinstance(ended[-1], SessionClosed), ended
    assert "closed by the application" in str(ended[-2])
    with pytest.raises(SessionClosed):
        await app.request(rq("after", "c0", 1, 60))
