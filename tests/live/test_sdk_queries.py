"""The SDK's questions that change nothing (cluster information, as a launcher asks before its first request)
are asked again after a timeout: the view publisher answers them from Valkey, and over a failover of the
Valkey primary it answered late -- 300-application ``bench_ha.py`` runs had rigid jobs fail before their
first request with nats-py's timeout. Real nats-server; the view publisher is played by the test, which
lets the first question go unanswered."""

from __future__ import annotations

import asyncio

from coorm.launchers.sdk import Session
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import ClusterInfo, ClustersInfoReply, InterClusterInfoReply
from coorm.shared.settings import Settings
from tests.live.test_sdk_close import _reply


async def test_cluster_information_is_asked_again_after_a_timeout(nats_url):
    settings = Settings(nats_url=nats_url)
    publisher = await bus.connect(nats_url, "view-publisher", settings.identity(Role.SERVICE))
    asked: dict[str, int] = {}

    async def answer(msg) -> None:
        asked[msg.subject] = asked.get(msg.subject, 0) + 1
        if asked[msg.subject] == 1:
            return  # busy (riding over a failover): this one times out
        out = (ClustersInfoReply(clusters=[ClusterInfo(id="c0", nodes=4, cores_per_node=2, memory_mb_per_node=64)])
               if msg.subject == subjects.CLUSTERS_INFO else InterClusterInfoReply(links=[]))
        await msg.respond(bus.encode(out))

    for subject in (subjects.CLUSTERS_INFO, subjects.CLUSTERS_INTERINFO):
        await publisher.subscribe(subject, cb=answer)
    await publisher.flush()
    nc = await bus.connect(nats_url, "app", settings.identity(Role.LAUNCHER))
    s = Session(nc=nc, reply=_reply(), settings=settings, own_connection=False, with_views=False)
    try:
        props = await asyncio.wait_for(s.cluster_props(), 20)
        assert props.nodes == {"c0": 4}
        assert asked == {subjects.CLUSTERS_INFO: 2, subjects.CLUSTERS_INTERINFO: 2}
    finally:
        s.closed = True
        await bus.shutdown(nc)
        await bus.shutdown(publisher)
