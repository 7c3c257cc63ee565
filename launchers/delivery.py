"""What the RMS tells a launcher of each decision, as the node allocator tells it live: ``startNotify`` once
the agents know the nodes' new owner (a pre-allocation's with no node IDs), ``killNotify`` on every end of a
started request -- its own ``done`` and a NEXT hand-over included; nothing for a request that never started.
One function, so that the simulator and the launchers' test harness deliver what a live launcher receives
(``services/node_allocator/service.py`` is the live side); and one :class:`ViewDeliverer`, for the views."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from coorm.launchers.base import Negotiate, OfferSeen, Respond
from coorm.shared.events import Accepted, EndRequest, NodesAssigned, Offered, OfferLapsed, Rejected, StartRequest
from coorm.shared.negotiation import Answer
from coorm.shared.requests import RequestType
from coorm.shared.stepfn import StepFunction


@dataclass(frozen=True)
class Notice:
    app: str
    method: Literal["on_start", "on_end", "on_offer", "on_accepted"]
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
    # the policy engine's own notifications (notify.offer): an offer made in a pass, a lapse
    if isinstance(d, Offered) and d.unsolicited:
        return Notice(d.app, "on_offer", (seen(d),))
    if isinstance(d, OfferLapsed):
        return Notice(d.app, "on_offer", (OfferSeen(d.negotiation, d.offer, lapsed=True),))
    return None


def seen(d: Offered) -> OfferSeen:
    return OfferSeen(d.negotiation, d.offer, d.nodes, d.start, d.deadline)


def answer(app: str, command: Negotiate | Respond, reply: object) -> Notice | None:
    """The launcher call the policy core's reply to a negotiation's message becomes, as the SDK's
    ``negotiate`` / ``respond`` returns it live (``LiveRunner``): an offer, an accepted request, a standing
    negotiation waiting, a refusal (a lapse among them); None for a reject's answer."""
    negotiation = command.terms.negotiation if isinstance(command, Negotiate) else command.offer.rsplit(".o", 1)[0]
    if isinstance(reply, Offered):
        return Notice(app, "on_offer", (seen(reply),))
    if isinstance(reply, Rejected):
        lapsed = reply.code.value == "offer_lapsed"
        offer = command.offer if isinstance(command, Respond) else None
        return Notice(app, "on_offer", (OfferSeen(negotiation, offer, lapsed=lapsed,
                                                  refused=None if lapsed else reply.code.value),))
    if isinstance(reply, Accepted) and reply.requests:
        return Notice(app, "on_accepted", (negotiation, reply.requests[0]))
    if isinstance(command, Respond) and command.answer is Answer.REJECT:
        return None
    return Notice(app, "on_offer", (OfferSeen(negotiation, waiting=True),))  # standing, nothing now


class ViewDeliverer:
    """What each application is told of its views (``changeNotify``): per cluster and view type, only a view
    that changed since it was last told -- the same future seen from a later "now" is no change. The view
    publisher runs one live; the simulator and the launchers' test harness run one each."""

    def __init__(self) -> None:
        self.sent: dict[str, dict[tuple[str, str], StepFunction]] = {}  # app -> (cluster, type) -> last told

    def changes(self, app: str, views: Mapping[str, tuple[StepFunction, StepFunction | None]],
                same: dict[tuple[int, int], tuple[StepFunction, StepFunction, bool]] | None = None
                ) -> list[tuple[str, str, StepFunction]]:
        """Of ``views`` (cluster -> non-preemptive view, preemptive view or None), those to tell ``app``, as
        (cluster, ``"non_preemptive"`` or ``"preemptive"``, view), clusters in name order; they count as told.
        ``same``, shared by the calls of one round, remembers which (last told, new) pairs of view objects
        are the same future: applications that share views share the objects, and a thousand of them
        compared the same two views a thousand times."""
        last = self.sent.setdefault(app, {})
        out = []
        for cluster in sorted(views):
            for typ, view in zip(_TYPES, views[cluster], strict=True):
                if view is None:
                    continue
                old = last.get((cluster, typ))
                if old is not None and _same(old, view, same):
                    continue
                last[(cluster, typ)] = view
                out.append((cluster, typ, view))
        return out

    def forget(self, app: str) -> None:
        """``app`` is told everything again from now on (its session ended, or it asked for all its views)."""
        self.sent.pop(app, None)


_TYPES = ("non_preemptive", "preemptive")


def _same(old: StepFunction, new: StepFunction,
          memo: dict[tuple[int, int], tuple[StepFunction, StepFunction, bool]] | None) -> bool:
    """Whether ``new`` is ``old`` seen from a later "now". The memo keeps both objects alive with the
    answer, so that no id in its keys is reused by another object while it lasts."""
    if memo is None:
        return old.clip(new.times[0]) == new
    key = (id(old), id(new))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (old, new, old.clip(new.times[0]) == new)
    return hit[2]
