"""A client that sends hostile input to every subject, each as the identity NATS lets publish there."""

from __future__ import annotations

from coorm.shared import bus
from coorm.shared.credentials import signature_headers
from coorm.shared.endpoints import Role
from coorm.shared.settings import Settings


class Prober:
    """Sends what it is told to each subject as the identity allowed to publish there (the services', an
    agent's, or this user's: NATS would drop anything else before it reached a handler), signed where the
    receiver checks a signature: what reaches the handlers is the hostile input itself."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ncs: dict[Role, object] = {}

    async def connect(self) -> Prober:
        for role in Role:
            self.ncs[role] = await bus.connect(self.settings.nats_url, f"prober-{role}", self.settings.identity(role))
        return self

    @staticmethod
    def role_of(subject: str) -> Role:
        tokens = subject.split(".")
        if tokens[2] == "internal" or (tokens[2] == "node" and tokens[4] in ("assign", "kill")):
            return Role.SERVICE
        return Role.AGENT if tokens[2] == "agent" else Role.LAUNCHER

    async def request(self, subject: str, data: bytes, timeout: float = 5.0):
        role = self.role_of(subject)
        nc = self.ncs[role]
        headers = None
        # signed, but for a message the signature would take past the server's max payload (the server would
        # close the connection): that one goes unsigned, and is refused for that
        if role is Role.SERVICE and subject.split(".")[2] == "node" and len(data) + 256 <= nc.max_payload:
            headers = signature_headers(self.settings.identity(Role.SERVICE), subject, data)
        return await nc.request(subject, data, timeout=timeout, headers=headers)

    @property
    def user(self):
        return self.ncs[Role.LAUNCHER]

    @property
    def max_payload(self) -> int:
        return self.user.max_payload

    async def close(self) -> None:
        for nc in self.ncs.values():
            await bus.shutdown(nc)
