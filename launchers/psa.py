"""A malleable parameter-sweep application (CooRMv2 §V-A2; KOALA's PSA).

An unbounded (or ``total_tasks``-long) list of single-node tasks of ``task_duration`` seconds each. The
launcher follows its preemptive view of one cluster with one preemptible request, updated by NEXT:

* the view grows: it asks for the nodes the view keeps for at least a whole task and starts a task on
  every new node (a shorter hole would only be wasted on killed tasks);
* the view drops *now* below what it holds: it kills the tasks that ran the least (their work so far is
  **waste**) and releases those nodes at once;
* the view drops *later* (an announced update of another application): when a task ends it starts a new
  one only if the view keeps that node for a whole task (``min`` of the view over the task's duration);
  otherwise it releases the node, so nothing is killed when the announce came early enough.

Rules: it never asks for more than its view shows now; it has at most one update in flight (a NEXT
successor not started yet) and re-reads the view once that update started; it sets a timer at the next
time its view leaves what it holds, since a change announced earlier brings no new view then; a request
still waiting when the view no longer holds it (another application asked at the same time) is cancelled
and asked again within the view.
"""

from __future__ import annotations

from launchers.base import Command, Launcher, Timer, Views
from shared.requests import RequestSpec, RequestType

_EPS = 1e-9


class PSALauncher(Launcher):
    kind = "psa"
    background = True  # the simulation may stop while it still has work
    wants_preemptive = True
    views_after_start = True

    def __init__(
        self, app: str, cluster: str, task_duration: float, *, total_tasks: int | None = None
    ) -> None:
        super().__init__(app)
        self.cluster = cluster
        self.task_duration = float(task_duration)
        self.total_tasks = total_tasks
        self.current: str | None = None  # the started preemptible request
        self.pending: str | None = None  # its NEXT successor, asked for, not started yet
        self.pending_nodes = 0
        self.tasks: dict[str, float] = {}  # node -> start time of its task
        self.views: Views | None = None
        self.waste = 0.0
        self.completed = 0
        self.killed = 0
        self.updates = 0
        self._lost_current = False
        self._watching: set[float] = set()

    # -- helpers ------------------------------------------------------------------------------------
    def _view(self):
        return self.views.preemptive[self.cluster] if self.views else None

    def _ask(self, now: float, nodes: int, released: tuple[str, ...] = ()) -> list[Command]:
        """Replace the current request by one of ``nodes`` nodes (none: just release everything)."""
        out: list[Command] = []
        for node in released:
            self.tasks.pop(node, None)
        if self.current is not None:
            if nodes <= 0:
                for node in list(self.tasks):
                    self._kill(now, node)
                out.append(self.finish(self.current))
                self.current = None
                return out
            rid = self.new_id()
            self.updates += 1
            out.append(self.submit(RequestSpec(id=rid, type=RequestType.PREEMPTIBLE, cluster=self.cluster,
                                               nodes=nodes, related_to=self.current, related_how="NEXT")))
            out.append(self.finish(self.current, released))
            self.current, self.pending, self.pending_nodes = None, rid, nodes
        elif nodes > 0 and self.pending is None:
            rid = self.new_id()
            out.append(self.submit(RequestSpec(id=rid, type=RequestType.PREEMPTIBLE, cluster=self.cluster,
                                               nodes=nodes)))
            self.pending, self.pending_nodes = rid, nodes
        return out

    def _kill(self, now: float, node: str) -> None:
        start = self.tasks.pop(node, None)
        if start is not None:
            self.waste += now - start
            self.killed += 1

    def _held(self) -> int:
        return len(self.running.get(self.current, ())) if self.current else 0

    def _adapt(self, now: float) -> list[Command]:
        view = self._view()
        if view is None or self.finished:
            return []
        if self.pending is not None:
            if max(view.value_at(now), 0) < self.pending_nodes:
                # our waiting request no longer fits the view (another application asked too): ask again
                out: list[Command] = [self.cancel(self.pending)]
                self.pending, self.pending_nodes = None, 0
                return out + self._adapt(now)
            return []
        now_value = max(view.value_at(now), 0)
        held = self._held()
        if now_value < held:
            # immediate drop: kill the tasks that ran the least
            victims = sorted(self.tasks, key=lambda n: (-self.tasks[n], n))[: held - now_value]
            idle = [n for n in self.running[self.current] if n not in self.tasks]
            victims += idle[: held - now_value - len(victims)]
            for node in victims:
                self._kill(now, node)
            return self._ask(now, now_value, tuple(victims)) + self._watch(now, view, now_value)
        offered = min(now_value, view.min_over(now, now + self.task_duration))
        if self.total_tasks is not None:
            offered = min(offered, max(self.total_tasks - self.completed - len(self.tasks) + held, 0))
        out = self._ask(now, offered) if offered > held else []
        return out + self._watch(now, view, max(offered, held))

    def _watch(self, now: float, view, keep: int) -> list[Command]:
        """A timer at the next time the view drops below ``keep`` nodes, or rises above (a change
        announced earlier brings no new view when it happens)."""
        for t in view.breakpoints_after(now):
            if view.value_at(t) != keep:
                if t in self._watching:
                    return []
                self._watching.add(t)
                return [Timer(t, "view")]
        return []

    # -- events -------------------------------------------------------------------------------------
    def on_views(self, views: Views) -> list[Command]:
        self.views = views
        if self.pending is not None and self._lost_current:
            # our update did not start in the pass that ended its predecessor: those nodes are gone
            for node in list(self.tasks):
                self._kill(views.now, node)
            self._lost_current = False
        return self._adapt(views.now)

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        super().on_start(now, request, nodes)
        self.current, self.pending, self.pending_nodes = request, None, 0
        self._lost_current = False
        for node in [n for n in self.tasks if n not in nodes]:
            self._kill(now, node)  # its predecessor ended a pass before this start: that task died
        fresh = [n for n in nodes if n not in self.tasks]
        for node in fresh:
            self.tasks[node] = now
        out: list[Command] = [Timer(now + self.task_duration, "tasks")] if fresh else []
        return out + self._adapt(now)

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        super().on_end(now, request, reason)
        if reason == "done" and self.pending is not None:
            self._lost_current = True  # cleared by the successor's start in the same batch
        if reason in ("violation", "session_closed"):
            for node in list(self.tasks):
                self._kill(now, node)
            self.finished = True
        elif reason == "node_failure" and request == self.current:
            for node in list(self.tasks):
                self._kill(now, node)
            self.current = None
        return []

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key == "view":
            return self._adapt(now)
        if key != "tasks" or self.current is None:
            return []
        ended = sorted(n for n, s in self.tasks.items() if s + self.task_duration <= now + _EPS)
        if not ended:
            return []
        view = self._view()
        running = len(self.tasks) - len(ended)
        release: list[str] = []
        restarted = False
        for node in ended:
            del self.tasks[node]
            self.completed += 1
            more = self.total_tasks is None or self.completed + len(self.tasks) < self.total_tasks
            keeps = view is not None and view.min_over(now, now + self.task_duration) >= running + 1
            if more and keeps:
                self.tasks[node] = now
                running += 1
                restarted = True
            else:
                release.append(node)
        out: list[Command] = [Timer(now + self.task_duration, "tasks")] if restarted else []
        if self.total_tasks is not None and self.completed >= self.total_tasks and not self.tasks:
            return out + [self.finish(self.current), *self.close()]
        if release:
            out += self._ask(now, self._held() - len(release), tuple(release))
        return out

    def stats(self) -> dict:
        return {"completed_tasks": self.completed, "killed_tasks": self.killed, "waste": self.waste,
                "updates": self.updates}
