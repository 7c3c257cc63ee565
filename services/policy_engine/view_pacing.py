"""When the applications whose views changed hear of them: the pace of ``changeNotify`` (a pure core:
time passed in).

A pass may change every application's views (one node freed changes everyone's non-preemptive view), and
passes may come every few milliseconds: sending every application its views after every pass makes the
traffic grow as applications x passes, and it is what limited the live system with 100 launchers. So views
are published in *rounds*:

* a round goes out at once if the last one is at least a *gap* old, else when the gap has passed; the
  applications whose views changed meanwhile wait, and hear of their latest views then (newer views replace
  older ones: a launcher only ever acts on the latest);
* the gap is ``period``, and longer when a round was large: at most ``rate`` notifications a second over
  all applications (a round of 1,000 applications with ``rate`` 2,000 holds the next one back half a second);
* urgent applications -- one whose preemptive view dropped under what it holds (it has ``preempt_grace`` to
  release), one that just opened its session -- go out at once, with everything pending.

Nothing is lost: an application pending at a round hears of its views as they stand then."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class ViewPacer:
    period: float = 0.1
    rate: float = 2000.0
    pending: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    fresh: set[str] = field(default_factory=set)  # opened, not yet sent any views
    urgent: bool = False
    next_round: float = float("-inf")  # no round before this time, unless urgent

    def opened(self, app: str) -> None:
        """``app`` opened its session: its first views go out at once (a launcher chooses on them)."""
        self.fresh.add(app)

    def changed(self, apps: Iterable[str], *, urgent: bool = False) -> None:
        """The views of ``apps`` changed (``urgent``: one of them must hear of it now)."""
        apps = set(apps)
        self.pending |= apps
        self.urgent = self.urgent or (bool(apps) and (urgent or not apps.isdisjoint(self.fresh)))

    def ended(self, app: str) -> None:
        """``app``'s session ended: nothing more to send it (the view publisher forgets it in the next round)."""
        self.pending.discard(app)
        self.fresh.discard(app)
        self.closed.add(app)

    def due_at(self) -> float | None:
        """When the next round should go out (None: nothing to send)."""
        if not self.pending and not self.closed:
            return None
        return float("-inf") if self.urgent else self.next_round

    def take(self, now: float) -> tuple[list[str], list[str]] | None:
        """The round to send now -- (applications, closed sessions), sorted -- or None if it is not due."""
        due = self.due_at()
        if due is None or now < due:
            return None
        apps, closed = sorted(self.pending), sorted(self.closed)
        self.fresh -= self.pending
        self.pending.clear()
        self.closed.clear()
        self.urgent = False
        gap = max(self.period, len(apps) / self.rate if self.rate > 0 else 0.0)
        self.next_round = now + gap
        return apps, closed
