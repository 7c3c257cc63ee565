"""The view publisher asks for every view again after a NATS reconnection: views the policy engine sent while
it was cut from NATS are lost (core NATS; in a NATS cluster the engine, on another server, goes on sending
them), and an application whose first views were among them waited for them for ever (``bench_ha.py``'s
hung applications: a session open, no request ever sent). Real nats-server and valkey; the policy engine is
played by the test (it answers the view publisher's ``internal.views`` query)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

from coorm.services.view_publisher.service import ViewPublisher
from coorm.shared import bus, subjects
from coorm.shared.credentials import CredentialStore
from coorm.shared.endpoints import Role
from coorm.shared.protocol import AppViews, ChangeNotify, ViewsEpoch
from coorm.shared.servers import _wait_port, start_servers
from coorm.shared.settings import Settings


def test_views_lost_while_cut_from_nats_are_sent_after_the_reconnection(tmp_path):
    with start_servers(tmp_path / "servers") as servers:
        settings = Settings(nats_url=servers.nats_url, redis_url=servers.redis_url,
                            credentials_dir=servers.credentials)
        service = CredentialStore(servers.credentials).role(Role.SERVICE)
        nats_proc = servers.procs[0]

        async def scenario() -> None:
            publisher = ViewPublisher(settings)
            stop = asyncio.Event()
            run = asyncio.create_task(publisher.run(stop))
            engine = await bus.connect(servers.nats_url, "engine", service)
            known: dict[str, dict[str, AppViews]] = {}  # what the "policy engine" answers a query with
            queries = []

            async def on_query(msg) -> None:
                queries.append(time.monotonic())
                await msg.respond(bus.encode(ViewsEpoch(epoch=1, now=time.time(), views=dict(known), full=True)))

            await engine.subscribe(subjects.VIEWS_QUERY, cb=on_query)
            await bus.settled(engine)
            got: asyncio.Queue = asyncio.Queue()
            app = "root.a7"
            watcher = await bus.connect(servers.nats_url, "app", service)
            async def on_change(m) -> None:
                got.put_nowait(m)

            await watcher.subscribe(subjects.notify_change(app), cb=on_change)
            await bus.settled(watcher)
            try:
                await asyncio.wait_for(publisher.ready.wait(), 10)
                while not queries:  # its first synchronisation
                    await asyncio.sleep(0.05)  # polling the test's own record: nothing to wait on
                # nats-server dies; while it is away the application opens and its first views go out (lost)
                os.kill(nats_proc.pid, signal.SIGKILL)
                nats_proc.wait()
                known[app] = {"c0": AppViews(non_preemptive=[(0.0, 4)])}
                restarted = subprocess.Popen(nats_proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True)
                servers.procs[0] = restarted
                _wait_port(servers.nats_port, restarted, "nats-server")
                # the publisher asks again once reconnected, and tells the application its views
                msg = await asyncio.wait_for(got.get(), 20)
                notify = bus.decode(msg.data, ChangeNotify)
                assert notify.app == app and [c.cluster for c in notify.changes] == ["c0"]
                assert len(queries) >= 2
            finally:
                stop.set()
                await asyncio.wait_for(run, 10)
                await bus.shutdown(engine)
                await bus.shutdown(watcher)

        asyncio.run(scenario())
