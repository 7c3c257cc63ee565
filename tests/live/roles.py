"""A test's connection that plays several parts at once -- the allocator, a launcher, an observer -- as the
identities that may play them: one NATS connection per identity, each subject going to the one the
endpoint table grants it to (a user's: this test user's), and the services' messages to the agents signed.
What the server would refuse to every identity is a mistake of the test: it fails at once."""

from __future__ import annotations

import getpass

from nats.aio.client import Client as NATS

from coorm.shared import bus
from coorm.shared.credentials import signature_headers
from coorm.shared.endpoints import Role, permissions
from coorm.shared.settings import Settings

ME = getpass.getuser()
ORDER = (Role.LAUNCHER, Role.SERVICE, Role.AGENT)  # who does a thing several may do: the user first


def matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    tokens, wild = subject.split("."), pattern.split(".")
    for i, w in enumerate(wild):
        if w == ">":
            return len(tokens) > i
        if i >= len(tokens) or (w != "*" and w != tokens[i]):
            return False
    return len(tokens) == len(wild)


def _grants(role: Role):
    return permissions(role, ME if role is Role.LAUNCHER else None)


def may(role: Role, action: str, subject: str) -> bool:
    grants = _grants(role)
    patterns = grants.publish if action == "publish" else grants.subscribe
    return any(matches(subject, p) for p in patterns)


class Roles:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ncs: dict[Role, NATS] = {}

    async def connect(self) -> Roles:
        for role in ORDER:
            self.ncs[role] = await bus.connect(self.settings.nats_url, f"test-{role}", self.settings.identity(role))
        return self

    def _for(self, action: str, subject: str) -> tuple[Role, NATS]:
        for role in ORDER:
            if may(role, action, subject):
                return role, self.ncs[role]
        raise AssertionError(f"no identity may {action} {subject}")

    def _headers(self, role: Role, subject: str, data: bytes, headers: dict | None) -> dict | None:
        """The services' signature on what they send the agents (an agent obeys nothing unsigned)."""
        tokens = subject.split(".")
        if headers is None and role is Role.SERVICE and tokens[2:3] == ["node"] and tokens[-1] in ("assign", "kill"):
            return signature_headers(self.settings.identity(Role.SERVICE), subject, data)
        return headers

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", headers: dict | None = None) -> None:
        role, nc = self._for("publish", subject)
        await nc.publish(subject, payload, reply=reply, headers=self._headers(role, subject, payload, headers))

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5, headers: dict | None = None):
        role, nc = self._for("publish", subject)
        return await nc.request(subject, payload, timeout=timeout,
                                headers=self._headers(role, subject, payload, headers))

    async def subscribe(self, subject: str, *args, **kw):
        return await self._for("subscribe", subject)[1].subscribe(subject, *args, **kw)

    @property
    def max_payload(self) -> int:
        return min(nc.max_payload for nc in self.ncs.values())

    def new_inbox(self) -> str:
        """An inbox of the services' (the ones that ask agents for kills)."""
        return self.ncs[Role.SERVICE].new_inbox()

    async def flush(self, timeout: int = 10) -> None:
        for nc in self.ncs.values():
            await bus.settled(nc, timeout)

    async def drain(self) -> None:
        for nc in self.ncs.values():
            await nc.drain()
