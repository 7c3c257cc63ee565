"""One side of the cross-process determinism test (tests/core/test_determinism.py), run as its own Python
process so that it hashes strings with its own ``PYTHONHASHSEED``.

``write SEED EVENTS CUT OUT``: a long random run through the coupled cores, as the policy engine drives them
(every wake-up the cores ask for becomes a logged tick); writes the events, the decisions of each, and a
snapshot taken after event CUT. ``restore IN OUT``: loads that snapshot, feeds it the events after CUT, and
writes the decisions it makes. ``replay IN OUT``: feeds every event to fresh cores."""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

from pydantic import TypeAdapter

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.service import LoggedEvent
from coorm.services.policy_engine.snapshot import Snapshot
from coorm.shared.events import CloseSession, Done, NodeDown, OpenSession, RegisterNodes, Submit, Tick
from coorm.shared.requests import RequestSpec

EVENTS: TypeAdapter[Any] = TypeAdapter(list[LoggedEvent])
CLUSTERS = {"c0": 24, "c1": 12}
SETTINGS = PolicySettings(fair_start=5.0, reschedule_interval=1.0, preempt_grace=10.0, pass_burst=2)
# or other policy settings, as JSON (the test runs KOALA's too): every process of a run reads the same
if os.environ.get("COORM_DETERMINISM_SETTINGS"):
    SETTINGS = PolicySettings.model_validate_json(os.environ["COORM_DETERMINISM_SETTINGS"])


def _dump(out: list) -> list[dict]:
    return [d.model_dump(mode="json") for d in out]


def _signatures(cores: CoupledCores) -> dict[str, list[int]]:
    """What the next pass compares each application's views with: equal states hash equal."""
    return {app: list(sig) for app, sig in cores.policy._signatures.items()}


class Run:
    """Random applications of every kind: rigid, moldable-like, pre-allocations with requests inside,
    NEXT updates, co-allocations, preemptible (malleable) requests; dones, cancels, closes, nodes lost and
    back. Events refer to what the generator has opened and submitted (some of them no longer live: their
    rejections are decisions too)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cores = CoupledCores(SETTINGS)
        self.events: list = []
        self.outs: list[list[dict]] = []
        self.apps: list[str] = []
        self.requests: dict[str, list[tuple[str, str, str]]] = {}  # app -> (id, type, cluster)
        self.down: list[str] = []
        self.n = 0
        self.opened = 0
        for c, size in CLUSTERS.items():
            self._feed(RegisterNodes(at=0.0, cluster=c, nodes=tuple(f"{c}n{i}" for i in range(size))))

    def _feed(self, event) -> None:
        self.n += 1
        event = event.model_copy(update={"stimulus_id": f"e{self.n}"})
        self.events.append(event)
        self.outs.append(_dump(self.cores.handle(event)))

    def step(self) -> None:
        rng = self.rng
        now = self.cores.now + rng.expovariate(1 / 8.0)
        # the shell's timer: every wake-up before the next stimulus
        while (w := self.cores.next_wakeup()) is not None and w < now:
            self._feed(Tick(at=max(w, self.cores.now)))
        x = rng.random()
        if x < 0.08 or not self.apps:
            self.opened += 1
            app = f"u{rng.randrange(4)}.a{self.opened}"
            self.apps.append(app)
            self.requests[app] = []
            self._feed(OpenSession(at=now, app=app, user=app.split(".")[0], adapts=rng.random() < 0.6))
        elif x < 0.4:
            app = rng.choice(self.apps)
            self._feed(Submit(at=now, app=app, requests=self._specs(app)))
        elif x < 0.78:
            app = rng.choice(self.apps)
            if self.requests[app]:
                rid, _, _ = rng.choice(self.requests[app])
                self._feed(Done(at=now, app=app, request=rid))
        elif x < 0.85:
            app = rng.choice(self.apps)
            self._feed(CloseSession(at=now, app=app))
            if rng.random() < 0.9:  # (a closed one is sometimes named again: refused)
                self.apps.remove(app)
        elif x < 0.96:
            c = rng.choice(sorted(CLUSTERS))
            node = f"{c}n{rng.randrange(CLUSTERS[c])}"
            if node not in self.down:
                self.down.append(node)
                self._feed(NodeDown(at=now, node=node))
        elif self.down:
            node = self.down.pop(rng.randrange(len(self.down)))
            self._feed(RegisterNodes(at=now, cluster=node.split("n")[0], nodes=(node,)))

    def _specs(self, app: str) -> list[RequestSpec]:
        rng = self.rng
        mine = self.requests[app]
        specs: list[RequestSpec] = []
        for _ in range(1 if rng.random() < 0.8 else 2):
            rid = f"{app}.{len(mine) + 1}"
            kind = rng.choices(["non-preemptible", "pre-allocation", "preemptible"], [8, 1, 1])[0]
            cluster = rng.choice(sorted(CLUSTERS))
            nodes = rng.randint(1, CLUSTERS[cluster] // 2)
            duration = None if kind == "preemptible" and rng.random() < 0.5 else float(rng.randint(5, 120))
            to, how = None, "FREE"
            same = [r for r in mine if r[1] == kind and r[2] == cluster]
            if same and rng.random() < 0.3:
                to, how = rng.choice(same)[0], "NEXT"
            elif mine and kind != "preemptible" and rng.random() < 0.15:
                to, how = rng.choice(mine)[0], "COALLOC"
            specs.append(RequestSpec(id=rid, type=kind, cluster=cluster, nodes=nodes, duration=duration,
                                     related_to=to, related_how=how))
            mine.append((rid, kind, cluster))
        return specs


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "write":
        seed, count, cut, out = int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
        run = Run(seed)
        snap = None
        while len(run.events) < count:
            run.step()
            if snap is None and len(run.events) >= cut:
                cut = len(run.events)
                snap = Snapshot.of(run.cores, f"{cut}-0", cut)
        assert snap is not None
        doc = {"events": EVENTS.dump_python(run.events, mode="json"), "outs": run.outs, "cut": cut,
               "signatures": _signatures(run.cores),
               "snapshot": {"state": snap.state, "last": snap.last, "format": snap.format, "events": snap.events}}
    else:
        src, out = argv[1], argv[2]
        with open(src) as f:
            written = json.load(f)
        events = EVENTS.validate_python(written["events"])
        if mode == "restore":
            snap = Snapshot.from_fields({k: str(v) for k, v in written["snapshot"].items()})
            assert snap is not None
            cores = snap.cores(SETTINGS)  # (a snapshot does not carry the settings: the engine's own replace them)
            events = events[written["cut"]:]
        else:
            cores = CoupledCores(SETTINGS)
        doc = {"outs": [_dump(cores.handle(e)) for e in events]}
        doc["signatures"] = _signatures(cores)
    with open(out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main(sys.argv[1:])
