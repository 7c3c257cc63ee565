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
