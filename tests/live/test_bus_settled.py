"""``bus.settled`` is a barrier: when it returns, the server has the subscriptions made before it. What a
connection writes is recorded by a TCP relay between it and a real nats-server, so the test sees the order
on the wire: a SUB made before ``settled`` must come before the PING whose PONG ended it. (nats-py's own
``flush()`` writes its PING ahead of the SUB still in its buffer: a service that trusted it could say it
was ready before it was, and a request sent at once find no responder -- as CI's run of
test_a_request_in_flight_across_a_reload_of_the_users_is_answered did, its request never received.)"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import nats
import pytest

from coorm.shared import bus
from coorm.shared.servers import _wait_port, free_port, nats_binary


@pytest.fixture
def plain_nats():
    """A nats-server of its own, no users: what is under test is the client's writes, not permissions."""
    port = free_port()
    proc = subprocess.Popen([nats_binary(), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, "nats-server")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Relay:
    """Listens on a port of its own, relays each connection to the server, and keeps what clients sent."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.sent = bytearray()
        self.tasks: list[asyncio.Task] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(BaseException):
                await t

    async def _on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.upstream)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, keep: bool) -> None:
            try:
                while data := await r.read(65536):
                    if keep:
                        self.sent += data
                    w.write(data)
                    await w.drain()
            finally:
                w.close()

        self.tasks += [asyncio.create_task(pipe(cr, sw, True)), asyncio.create_task(pipe(sr, cw, False))]


def _last_ping_follows(sent: bytes, command: bytes) -> bool:
    """Whether ``command`` was sent, and before the last PING."""
    at = sent.find(command)
    return at >= 0 and at < sent.rfind(b"PING\r\n")


async def test_a_subscription_is_on_the_server_when_settled_returns(plain_nats):
    relay = Relay(plain_nats)
    async with relay as port:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
        try:
            async def cb(msg) -> None:
                pass

            for i in range(20):  # each time afresh: the writer's state differs from one to the next
                await nc.subscribe(f"coorm-test.settled.{i}", cb=cb)
                await bus.settled(nc)
                assert _last_ping_follows(bytes(relay.sent), f"SUB coorm-test.settled.{i} ".encode()), i
                await nc.publish(f"coorm-test.settled.{i}", b"x")
                await bus.settled(nc)
                assert _last_ping_follows(bytes(relay.sent), f"PUB coorm-test.settled.{i} ".encode()), i
        finally:
            await nc.close()


async def test_a_request_right_after_serve_finds_its_responder(plain_nats):
    """What the barrier is for, across two connections: ``serve`` returns, and another client's request
    at once is answered (no ``no responders``), every time."""
    url = f"nats://127.0.0.1:{plain_nats}"
    service = await nats.connect(url, allow_reconnect=False)
    client = await nats.connect(url, allow_reconnect=False)
    try:
        from coorm.shared.protocol import Ack

        async def handler(_request, _msg):
            return Ack()

        for i in range(50):
            await bus.serve(service, f"coorm-test.serve.{i}", Ack, handler)
            reply = await client.request(f"coorm-test.serve.{i}", b"{}", timeout=10)
            assert b"error" not in reply.data, reply.data
    finally:
        await client.close()
        await service.close()
