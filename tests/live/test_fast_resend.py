"""The light path's requests sent again (``coorm.cli.fast._Asker``), against a real nats-server and a
responder of the test's: a query unanswered after ``RESEND_AFTER`` is sent again and the first reply taken; a
reply that comes late, to an earlier request on the same connection, is never taken for a later one's (a
``queue`` read page after page would list a page twice)."""

from __future__ import annotations

import asyncio
import json

from coorm.cli import fast
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from tests.live.test_system import _settings


async def test_a_query_sent_again_takes_its_own_reply_and_never_an_earlier_ones_late(servers, monkeypatch,
                                                                                     tmp_path):
    """The first page's first copy is answered only once the second page is asked (late), its second copy
    (sent after 2 s) at once; the second page's answer comes after that late one, on the same inbox."""
    monkeypatch.setenv("COORM_NATS_URL", servers.nats_url)
    monkeypatch.setenv("COORM_CREDENTIALS_DIR", str(servers.credentials))
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    responder = await bus.connect(servers.nats_url, "test-responder", _settings(servers).identity(Role.SERVICE))
    copies: list[int] = []
    held: list = []  # the first page's first copy, answered late

    async def answer(msg) -> None:
        offset = json.loads(msg.data)["offset"]
        copies.append(offset)
        if copies == [0]:
            held.append(msg)
            return
        if offset == 1:
            for late in held:  # answered now, before the second page's own answer
                await late.respond(json.dumps({"page": 0, "copy": "late"}).encode())
        await msg.respond(json.dumps({"page": offset}).encode())

    await responder.subscribe(subjects.BATCH_QUERY, cb=answer)
    await responder.flush()

    def two_pages() -> list[dict]:
        client, where = fast.socket_client()
        with fast._Asker(client, where) as asker:
            return [json.loads(asker.ask(subjects.BATCH_QUERY, json.dumps({"offset": k}).encode(), resend=True)
                               or b"null") for k in (0, 1)]

    try:
        pages = await asyncio.to_thread(two_pages)
    finally:
        await bus.shutdown(responder)
    assert copies == [0, 0, 1]  # the first page sent again once, the second once
    assert pages == [{"page": 0}, {"page": 1}]


async def test_a_node_drain_unanswered_is_sent_again(servers, redis_url, monkeypatch, tmp_path, capsys):
    """``coorm node drain`` (the full command line): its first message unanswered (its reply lost as the
    engine moved), it is sent again after ``RESEND_AFTER`` and the command succeeds -- draining a drained node
    changes nothing. Before, it waited 10 s and failed (exit 3)."""
    import redis

    from coorm.cli import live
    from coorm.shared import keys
    from coorm.shared.protocol import Ack, NodesEvent

    monkeypatch.setenv("COORM_NATS_URL", servers.nats_url)
    monkeypatch.setenv("COORM_REDIS_URL", redis_url)
    monkeypatch.setenv("COORM_CREDENTIALS_DIR", str(servers.credentials))
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    r = redis.Redis.from_url(redis_url)
    r.hset(keys.NODES, "n0", json.dumps({"cluster": "c0", "state": "up"}))
    r.close()
    responder = await bus.connect(servers.nats_url, "test-responder", _settings(servers).identity(Role.SERVICE))
    copies: list[NodesEvent] = []

    async def answer(msg) -> None:
        copies.append(NodesEvent.model_validate_json(msg.data))
        if len(copies) > 1:  # (the first copy's reply is "lost")
            await msg.respond(bus.encode(Ack()))

    await responder.subscribe(subjects.NODES_EVENT, cb=answer)
    await responder.flush()
    try:
        await asyncio.to_thread(live.node_drain, ["n0"], "fan", drain=True)
    finally:
        await bus.shutdown(responder)
    assert [(c.kind, c.nodes, c.reason) for c in copies] == [("drain", ["n0"], "fan")] * 2
    assert "drained: n0" in capsys.readouterr().out
