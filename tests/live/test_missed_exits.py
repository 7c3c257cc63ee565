"""A launcher that could not hear asks each agent it launched on for the exits it missed (a session the RMS
reaped while it was cut off, a reconnection). Just after its server rejoins the cluster the query, or its
answer, may cross a route not yet back: an unanswered query is sent again, within the same 5 s."""

from __future__ import annotations

from coorm.launchers.sdk import Exited, Session
from coorm.services.stack import LocalStack
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import ExitsQuery, ExitsReply, ProcessExited
from tests.live.test_system import _settings


async def test_an_unanswered_query_for_missed_exits_is_sent_again(servers):
    settings = _settings(servers)
    async with LocalStack(settings, {"c0": 1}):
        app = await Session.open(settings, kind="rigid", views=False)
        asked: list[ExitsQuery] = []

        async def lossy_agent(msg) -> None:
            """An agent whose first answer is lost (it never comes): the second is told."""
            asked.append(ExitsQuery.model_validate_json(msg.data))
            if len(asked) > 1:
                gone = ProcessExited(node="ghost", app=app.app, request="r", pid=4242, code=-15, killed=True)
                await msg.respond(bus.encode(ExitsReply(exits=[gone])))

        agent = await bus.connect(settings.nats_url, "lossy-agent", settings.identity(Role.AGENT))
        await agent.subscribe(subjects.node_exits("ghost", app.user), cb=lossy_agent)
        await agent.flush()
        try:
            app._unexited["ghost", 4242] = "r"  # a process it launched there, whose exit it did not hear
            await app._missed_exits()
            ev = await app.next_event(5)
            assert isinstance(ev, Exited) and (ev.pid, ev.killed, ev.code) == (4242, True, -15), ev
            assert len(asked) == 2 and all(q.app == app.app for q in asked)
        finally:
            await bus.shutdown(agent)
            await app.close()
