"""Views shared by many applications travel once from the policy engine to the view publisher (``ViewsEpoch``'s
``shared`` and ``refs``), and each application is told exactly what it would be told had the engine sent it
its own copy: the same ``changeNotify`` (every field), nothing when its view did not change, its own view
beside the shared ones, and a key the message does not fill names nothing. Real nats-server and valkey; the
policy engine is played by the test."""

from __future__ import annotations

import asyncio
import time

from coorm.services.view_publisher.service import ViewPublisher
from coorm.shared import bus, subjects
from coorm.shared.credentials import CredentialStore
from coorm.shared.endpoints import Role
from coorm.shared.protocol import AppViews, ChangeNotify, ViewsEpoch
from coorm.shared.servers import start_servers
from coorm.shared.settings import Settings

APPS = [f"root.a{i}" for i in range(5)]


def test_shared_views_are_told_to_each_application_as_its_own(tmp_path):
    with start_servers(tmp_path / "servers") as servers:
        settings = Settings(nats_url=servers.nats_url, redis_url=servers.redis_url,
                            credentials_dir=servers.credentials)
        service = CredentialStore(servers.credentials).role(Role.SERVICE)

        async def scenario() -> None:
            publisher = ViewPublisher(settings)
            stop = asyncio.Event()
            run = asyncio.create_task(publisher.run(stop))
            engine = await bus.connect(servers.nats_url, "engine", service)

            async def on_query(msg) -> None:  # its first synchronisation: nothing known yet
                await msg.respond(bus.encode(ViewsEpoch(epoch=0, now=time.time(), full=True)))

            await engine.subscribe(subjects.VIEWS_QUERY, cb=on_query)
            await bus.settled(engine)
            got: dict[str, asyncio.Queue] = {app: asyncio.Queue() for app in APPS}
            watcher = await bus.connect(servers.nats_url, "apps", service)
            for app in APPS:
                async def on_change(m, app=app) -> None:
                    got[app].put_nowait(bus.decode(m.data, ChangeNotify))

                await watcher.subscribe(subjects.notify_change(app), cb=on_change)
            await bus.settled(watcher)

            async def send(epoch: ViewsEpoch) -> None:
                await engine.publish(subjects.SCHEDULE_EPOCH, bus.encode(epoch))
                await bus.settled(engine)

            async def told(expected: dict[str, list[tuple[str, str, list]]]) -> None:
                """Each application hears what is expected of it (a marker epoch to one more application
                shows that nothing else came before it)."""
                marker = APPS[-1]
                await send(ViewsEpoch(epoch=99, now=0.0, views={marker: {"m": AppViews(non_preemptive=[(0.0, 1)])}}))
                await asyncio.wait_for(got[marker].get(), 10)
                publisher.told.forget(marker)
                for app in APPS[:-1]:
                    want = expected.get(app)
                    if want is None:
                        assert got[app].empty(), f"{app} was told of an unchanged view"
                        continue
                    note = got[app].get_nowait()
                    assert note.app == app and note.epoch == 1 and note.now == 12.5
                    assert [(c.cluster, c.type.value, [list(s) for s in c.cap]) for c in note.changes] == want
                    assert got[app].empty()

            try:
                await asyncio.wait_for(publisher.ready.wait(), 10)
                shared = AppViews(non_preemptive=[(12.5, 8), (100.0, 6)])
                own = AppViews(non_preemptive=[(12.5, 3)], preemptive=[(12.5, 2)])
                # a0..a2 share a view of c0; a2 sees its own on c1; a3 names a key that is not there
                await send(ViewsEpoch(epoch=1, now=12.5, shared={"v0": shared}, views={APPS[2]: {"c1": own}},
                                      refs={APPS[0]: {"c0": "v0"}, APPS[1]: {"c0": "v0"}, APPS[2]: {"c0": "v0"},
                                            APPS[3]: {"c0": "nothing"}}))
                view = ("c0", "non_preemptive", [[12.5, 8], [100.0, 6]])
                await told({APPS[0]: [view], APPS[1]: [view],
                            APPS[2]: [view, ("c1", "non_preemptive", [[12.5, 3]]), ("c1", "preemptive", [[12.5, 2]])]})
                # the same again (a1's in the old form, its own copy): no change, nobody is told
                await send(ViewsEpoch(epoch=1, now=12.5, shared={"v0": shared},
                                      views={APPS[1]: {"c0": shared}}, refs={APPS[0]: {"c0": "v0"}}))
                await told({})
                # the shared view changes for a0 and a1, not for a2 (still in the old one, its own)
                await send(ViewsEpoch(epoch=1, now=12.5, shared={"v1": AppViews(non_preemptive=[(12.5, 7)])},
                                      views={APPS[2]: {"c0": shared}},
                                      refs={APPS[0]: {"c0": "v1"}, APPS[1]: {"c0": "v1"}}))
                await told({APPS[0]: [("c0", "non_preemptive", [[12.5, 7]])],
                            APPS[1]: [("c0", "non_preemptive", [[12.5, 7]])]})
                # what a launcher asks for after subscribing: its views, refs resolved
                reply = await bus.call(watcher, subjects.app_views(APPS[0]), _info(), ChangeNotify, timeout=5)
                assert [(c.cluster, [list(s) for s in c.cap]) for c in reply.changes] == [("c0", [[12.5, 7]])]
            finally:
                stop.set()
                await asyncio.wait_for(run, 10)
                await bus.shutdown(engine)
                await bus.shutdown(watcher)

        asyncio.run(scenario())


def _info():
    from coorm.shared.protocol import InfoQuery

    return InfoQuery()
