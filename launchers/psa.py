"""A malleable parameter-sweep application (CooRMv2 §V-A2; KOALA's PSA).

An unbounded (or ``total_tasks``-long) list of single-node tasks of ``task_duration`` seconds each. The
launcher follows its preemptive view of one cluster with preemptible requests:

* the view grows: it asks, with one more FREE preemptible request, for the nodes the view keeps for at
  least a whole task, and starts a task on every new node (a shorter hole would only be wasted on killed
  tasks). Growing never touches what it holds, so two PSAs growing into the same freed nodes in one pass
  (under ``filling`` both see them) cannot lose what they had: the request that does not fit waits, and is
  cancelled and asked again within the view;
* the view drops *now* below what it holds: it releases idle nodes first, then kills the tasks that ran
  the least (their work so far is **waste**), and gives those nodes back at once with an update (a NEXT
  successor of the rest, ``done`` naming the released node IDs) or ``done`` when a request goes whole;
* the view drops *later* (an announced update of another application): when a task ends it starts a new
  one only if the view keeps that node for a whole task (``min`` of the view over the task's duration);
  otherwise it gives the node back, so nothing is killed when the announce came early enough.

It never asks for more than its view shows now, nor past ``max_nodes`` (KOALA's maximum size of a
malleable job: more "would just waste processors"; the RMS then offers the rest to the others), keeps at
most one growth request waiting, and sets a timer at the next time its view leaves what it holds, since a
change announced earlier brings no new view when it happens.
"""

from __future__ import annotations

from coorm.launchers.base import Command, Launcher, Timer, Views
from coorm.shared.requests import RequestSpec, RequestType

_EPS = 1e-9


class PSALauncher(Launcher):
    kind = "psa"
    background = True  # the simulation may stop while it still has work
    wants_preemptive = True
    views_after_start = True

    def __init__(
        self, app: str, cluster: str, task_duration: float, *, total_tasks: int | None = None,
        max_nodes: int | None = None,
    ) -> None:
        super().__init__(app)
        if task_duration <= 0:
            raise ValueError("task_duration must be > 0")
        if max_nodes is not None and max_nodes < 1:
            raise ValueError("max_nodes must be >= 1")
        self.max_nodes = max_nodes
        self.cluster = cluster
        self.task_duration = float(task_duration)
        self.total_tasks = total_tasks
        self.asked: dict[str, int] = {}  # waiting requests that bring new nodes -> their size
        self.handing: dict[str, tuple[str, ...]] = {}  # a shrink's NEXT successor -> the nodes it keeps
        self.tasks: dict[str, float] = {}  # node -> start time of its task
        self.views: Views | None = None
        self.waste = 0.0
        self.completed = 0
        self.killed = 0
        self.updates = 0
        self._watching: set[float] = set()

    # -- what it holds ------------------------------------------------------------------------------
    def _view(self):
        return self.views.preemptive[self.cluster] if self.views else None

    def _nodes(self) -> list[str]:
        """Every node it holds or is handing over to a shrink's successor."""
        out = [n for nodes in self.running.values() for n in nodes]
        return out + [n for nodes in self.handing.values() for n in nodes]

    def _held(self) -> int:
        return len(self._nodes())

    def _more_tasks(self) -> bool:
        return self.total_tasks is None or self.completed + len(self.tasks) < self.total_tasks

    # -- commands -----------------------------------------------------------------------------------
    def _kill(self, now: float, node: str) -> None:
        start = self.tasks.pop(node, None)
        if start is not None:
            self.waste += now - start
            self.killed += 1

    def _release(self, now: float, nodes: list[str]) -> list[Command]:
        """Give ``nodes`` back (their tasks, if any, are killed): per request, ``done`` when it goes whole,
        otherwise an update that keeps the rest."""
        out: list[Command] = []
        gone = set(nodes)
        for rid, held in list(self.running.items()):
            released = tuple(n for n in held if n in gone)
            if not released:
                continue
            for node in released:
                self._kill(now, node)
            kept = tuple(n for n in held if n not in gone)
            if kept:
                succ = self.new_id()
                self.updates += 1
                out.append(self.submit(RequestSpec(id=succ, type=RequestType.PREEMPTIBLE, cluster=self.cluster,
                                                   nodes=len(kept), related_to=rid, related_how="NEXT")))
                self.handing[succ] = kept
            out.append(self.finish(rid, released if kept else ()))
        return out

    def _cancel_asked(self) -> list[Command]:
        out: list[Command] = [self.cancel(rid) for rid in self.asked]
        self.asked.clear()
        return out

    # -- decisions ----------------------------------------------------------------------------------
    def _adapt(self, now: float) -> list[Command]:
        view = self._view()
        if view is None or self.finished:
            return []
        out: list[Command] = []
        now_value = max(view.value_at(now), 0)
        held = self._held()
        if self.asked and now_value < held + sum(self.asked.values()):
            # a waiting request the view no longer holds (another application asked in the same pass)
            out += self._cancel_asked()
        if now_value < held:
            # immediate drop: idle nodes first, then the tasks that ran the least
            releasable = [n for nodes in self.running.values() for n in nodes]
            idle = sorted(n for n in releasable if n not in self.tasks)
            busy = sorted((n for n in releasable if n in self.tasks), key=lambda n: (-self.tasks[n], n))
            out += self._release(now, (idle + busy)[: held - now_value])
            return out + self._watch(now, view, now_value)
        out += self._fill_idle(now)
        keep = min(now_value, view.min_over(now, now + self.task_duration))
        if self.total_tasks is not None:
            keep = min(keep, held + max(self.total_tasks - self.completed - len(self.tasks), 0))
        if self.max_nodes is not None:
            keep = min(keep, self.max_nodes)
        if keep > held and not self.asked:
            rid = self.new_id()
            out.append(self.submit(RequestSpec(id=rid, type=RequestType.PREEMPTIBLE, cluster=self.cluster,
                                               nodes=keep - held)))
            self.asked[rid] = keep - held
        return out + self._watch(now, view, max(keep, held))

    def _fill_idle(self, now: float) -> list[Command]:
        """Start a task on each idle node the view keeps for a whole task; give the others back."""
        view = self._view()
        idle = sorted(n for nodes in self.running.values() for n in nodes if n not in self.tasks)
        if not idle:
            return []
        room = view.min_over(now, now + self.task_duration) if view is not None else 0
        unused: list[str] = []
        started = False
        for node in idle:
            if self._more_tasks() and len(self.tasks) + 1 <= room:
                self.tasks[node] = now
                started = True
            else:
                unused.append(node)
        out: list[Command] = [Timer(now + self.task_duration, "tasks")] if started else []
        if self.total_tasks is not None and self.completed >= self.total_tasks and not self.tasks:
            out += [self.finish(rid) for rid in list(self.running)] + self._cancel_asked()
            self.handing.clear()
            return out + self.close()
        return out + (self._release(now, unused) if unused else [])

    def _watch(self, now: float, view, keep: int) -> list[Command]:
        """A timer at the next time the view leaves ``keep`` nodes, down or up (a change announced
        earlier brings no new view when it happens)."""
        for t in view.breakpoints_after(now):
            if view.value_at(t) != keep:
                if t in self._watching:
                    return []
                self._watching.add(t)
                return [Timer(t, "view")]
        return []

    # -- events -------------------------------------------------------------------------------------
    def on_views(self, views: Views) -> list[Command]:
        # a shrink's successor that has not started yet still counts as held: the RMS keeps its nodes for it
        # (and a view may overtake the start notification on a live system)
        self.views = views
        return self._adapt(views.now)

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        super().on_start(now, request, nodes)
        kept = self.handing.pop(request, ())
        self.asked.pop(request, None)
        for node in kept:
            if node not in nodes:
                self._kill(now, node)  # not carried over after all: that task died
        return self._adapt(now)

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        nodes = self.running.get(request, ())
        super().on_end(now, request, reason)
        self.asked.pop(request, None)
        if self.handing.pop(request, None) is not None:
            # a shrink's successor that never started (refused: its predecessor had ended meanwhile): the
            # nodes it was to keep are gone with the predecessor; what the view offers can be asked again
            return self._adapt(now)
        if reason in ("violation", "session_closed"):
            for node in list(self.tasks):
                self._kill(now, node)
            self.finished = True
        elif reason != "done":
            for node in nodes:  # node failure, walltime: the tasks on those nodes died
                self._kill(now, node)
        return []

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key == "view":
            return self._adapt(now)
        if key != "tasks":
            return []
        ended = [n for n, s in self.tasks.items() if s + self.task_duration <= now + _EPS]
        for node in ended:
            del self.tasks[node]
            self.completed += 1
        return self._fill_idle(now) if ended else []

    def stats(self) -> dict:
        return {"completed_tasks": self.completed, "killed_tasks": self.killed, "waste": self.waste,
                "updates": self.updates}
