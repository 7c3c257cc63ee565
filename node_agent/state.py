"""The node agent's bookkeeping, without I/O: which request of which application owns each node and until
when, who may launch there, which processes run for which request, and what must be killed when.

Time is passed in (wall-clock seconds, the same clock as ``NodeAssign.end``). The shell
(:mod:`coorm.node_agent.agent`) feeds it messages and process events and carries out what it returns: pids to
kill. Rules:

* a node belongs to at most one request at a time (the last :meth:`NodeBook.assign` for it);
* a launch is allowed only for the node's current request and application, before the assignment's end,
  with the token whose SHA-256 the assignment carries;
* an assignment naming ``previous`` carries the processes the same application runs under ``previous`` on
  that node over to the new request (NEXT hand-over); processes of any other request on that node are
  returned to be killed (the node is no longer theirs);
* a kill forgets the request's assignment of the node and returns the request's processes there;
* an assignment whose ``end`` passed more than ``kill_grace`` seconds ago (no new assignment since) is
  forgotten and its processes returned to be killed (:meth:`NodeBook.expire`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from coorm.shared.events import ErrorCode
from coorm.shared.protocol import NodeAssign


class Refused(Exception):
    """A launch the node's owner did not make."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class UnknownNode(KeyError):
    pass


@dataclass(frozen=True, slots=True)
class Assignment:
    app: str
    request: str
    nodes: tuple[str, ...]
    token_sha256: str
    end: float | None = None


@dataclass(slots=True)
class ProcessRecord:
    pid: int
    node: str
    app: str
    request: str
    killed: bool = False  # the agent is killing it (told to, replaced owner, end passed, agent stopping)
    reason: str | None = None  # why (``ProcessExited.reason``): the RMS's or the agent's own


@dataclass(frozen=True, slots=True)
class Expired:
    node: str
    app: str
    request: str
    end: float
    pids: tuple[int, ...]


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class NodeBook:
    def __init__(self, nodes: Iterable[str], *, kill_grace: float) -> None:
        self.nodes: tuple[str, ...] = tuple(nodes)
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError("duplicate node IDs")
        self.kill_grace = kill_grace
        self._assigned: dict[str, Assignment] = {}
        self._procs: dict[int, ProcessRecord] = {}

    # -- queries ------------------------------------------------------------------------------------
    def assignment(self, node: str) -> Assignment | None:
        self._check(node)
        return self._assigned.get(node)

    def process(self, pid: int) -> ProcessRecord | None:
        return self._procs.get(pid)

    def processes(self, node: str | None = None, request: str | None = None) -> list[ProcessRecord]:
        return [p for p in self._procs.values()
                if (node is None or p.node == node) and (request is None or p.request == request)]

    @property
    def process_count(self) -> int:
        return len(self._procs)

    def next_expiry(self) -> float | None:
        """When :meth:`expire` next has something to do (end + kill_grace of the earliest assignment)."""
        ends = [a.end for a in self._assigned.values() if a.end is not None]
        return min(ends) + self.kill_grace if ends else None

    # -- messages -----------------------------------------------------------------------------------
    def assign(self, node: str, msg: NodeAssign) -> list[int]:
        """Record that ``node`` belongs to ``msg.request`` of ``msg.app``. Returns the pids to kill: the
        processes on the node of any request other than the new one (and than ``msg.previous`` of the same
        application, whose processes now run under the new request)."""
        self._check(node)
        self._assigned[node] = Assignment(
            app=msg.app, request=msg.request, nodes=tuple(msg.nodes), token_sha256=msg.token_sha256.lower(),
            end=msg.end,
        )
        doomed: list[int] = []
        for p in self._procs.values():
            if p.node != node or p.killed:
                continue
            if p.app == msg.app and p.request == msg.request:
                continue
            if p.app == msg.app and msg.previous is not None and p.request == msg.previous:
                p.request = msg.request
                continue
            p.killed, p.reason = True, p.reason or "reassigned"
            doomed.append(p.pid)
        return doomed

    def check_launch(self, node: str, app: str, request: str, token: str, now: float) -> Assignment:
        """The node's assignment if ``app``'s ``request`` may launch on it now with ``token``; otherwise
        :class:`Refused` (``NOT_OWNER``, or ``BAD_TOKEN`` for the right request with the wrong token)."""
        self._check(node)
        a = self._assigned.get(node)
        if a is None:
            raise Refused(ErrorCode.NOT_OWNER, f"node {node} is not allocated to any request now")
        if a.app != app or a.request != request:
            raise Refused(ErrorCode.NOT_OWNER, f"node {node} is not allocated to request {request} of {app} now")
        if a.end is not None and now > a.end:
            raise Refused(ErrorCode.NOT_OWNER,
                          f"the allocation of node {node} to request {request} ended {now - a.end:.1f} s ago")
        if not hmac.compare_digest(token_hash(token), a.token_sha256):
            raise Refused(ErrorCode.BAD_TOKEN, f"the token does not match application {app}")
        return a

    def kill(self, node: str, request: str, reason: str = "") -> list[int]:
        """Forget ``request``'s assignment of ``node`` (if it is the current one); return its processes
        there (including any already being killed), all marked killed (for ``reason``, unless they already
        were for another)."""
        self._check(node)
        a = self._assigned.get(node)
        if a is not None and a.request == request:
            del self._assigned[node]
        pids = []
        for p in self._procs.values():
            if p.node == node and p.request == request:
                p.killed, p.reason = True, p.reason or reason or None
                pids.append(p.pid)
        return pids

    def release(self, node: str, reason: str) -> list[int]:
        """The RMS says ``node`` belongs to no request: forget its assignment; every process there, marked
        killed for ``reason``."""
        self._check(node)
        self._assigned.pop(node, None)
        pids = []
        for p in self._procs.values():
            if p.node == node:
                p.killed, p.reason = True, p.reason or reason
                pids.append(p.pid)
        return pids

    def kill_all(self, reason: str = "agent_stopping") -> list[int]:
        """The agent stops: every process, marked killed; every assignment forgotten."""
        self._assigned.clear()
        for p in self._procs.values():
            p.killed, p.reason = True, p.reason or reason
        return list(self._procs)

    def expire(self, now: float) -> list[Expired]:
        """Forget every assignment whose end passed more than ``kill_grace`` ago; what to kill."""
        out: list[Expired] = []
        for node, a in list(self._assigned.items()):
            if a.end is None or now <= a.end + self.kill_grace:
                continue
            del self._assigned[node]
            pids = []
            for p in self._procs.values():
                if p.node == node and p.request == a.request and p.app == a.app:
                    p.killed, p.reason = True, p.reason or "allocation_ended"
                    pids.append(p.pid)
            out.append(Expired(node=node, app=a.app, request=a.request, end=a.end, pids=tuple(pids)))
        return out

    # -- processes ----------------------------------------------------------------------------------
    def started(self, pid: int, node: str, app: str, request: str) -> ProcessRecord:
        self._check(node)
        if pid in self._procs:
            raise ValueError(f"pid {pid} is already running")
        rec = ProcessRecord(pid=pid, node=node, app=app, request=request)
        self._procs[pid] = rec
        return rec

    def mark_killed(self, pid: int, reason: str) -> None:
        rec = self._procs.get(pid)
        if rec is not None:
            rec.killed, rec.reason = True, rec.reason or reason

    def exited(self, pid: int) -> ProcessRecord | None:
        """The process ended: forget it; its record (request as of now, whether the agent killed it)."""
        return self._procs.pop(pid, None)

    def _check(self, node: str) -> None:
        if node not in self.nodes:
            raise UnknownNode(node)
