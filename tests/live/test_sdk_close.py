"""``Session.close`` on a connection the server dropped: it returns (the RMS reaps a session it did not hear
close), never with a CancelledError that is not the caller's own -- nats-py cancels what waits on a
connection it closes, and one 300-application ``bench_ha.py`` run had such a CancelledError end an
application -- while a cancellation of the caller itself still ends the close. Real nats-server, SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import signal

from coorm.launchers.sdk import Session
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import SessionOpenReply, SessionSubjects
from coorm.shared.servers import start_servers
from coorm.shared.settings import Settings
from tests.live.roles import ME

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
