"""What the RMS tells a launcher of each decision, as the node allocator tells it live: ``startNotify`` once
the agents know the nodes' new owner (a pre-allocation's with no node IDs), ``killNotify`` on every end of a
started request -- its own ``done`` and a NEXT hand-over included; nothing for a request that never started.
One function, so that the simulator and the launchers' test harness deliver what a live launcher receives
(``services/node_allocator/service.py`` is the live side)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coorm.shared.events import EndRequest, NodesAssigned, StartRequest
from coorm.shared.requests import RequestType


@dataclass(frozen=True)
class Notice:
    app: str
    method: Literal["on_start", "on_end"]
    args: tuple


def notice(d: object) -> Notice | None:
    """The launcher call ``d`` becomes (``Launcher.on_start(now, request, nodes)``,
    ``Launcher.on_end(now, request, reason)``), or None."""
    if isinstance(d, NodesAssigned):
        return Notice(d.app, "on_start", (d.request, tuple(d.nodes)))
    if isinstance(d, StartRequest) and d.type is RequestType.PRE_ALLOCATION:
        return Notice(d.app, "on_start", (d.request, ()))
    if isinstance(d, EndRequest) and d.started:
        return Notice(d.app, "on_end", (d.request, d.reason.value))
    return None
