"""Issue 17's re-selection livelock, measured: the spaced twin's live half with the selecting launchers'
``start_lag`` as given (0: as before the fix) and, optionally, starts heard later than views.

``python -m coorm.experiments.twin_reselection --start-lag 0 --hold 0.3`` runs the 122 applications of
``twin-spaced`` once over ``coorm up`` (about 3 minutes) and prints what tells a livelock: applications not
completed, the adaptive (moldable, CEM) applications' requests, and how many of them started and ended
within a second -- a request cancelled after it had started. ``--hold``: every start, kill and exit
reaches its launcher that many seconds later, views not (the node allocator's path slower than the view
publisher's, as on a loaded machine)."""

from __future__ import annotations

import argparse
import collections

from coorm.experiments import twin_live
from coorm.experiments.twin import completed
from coorm.experiments.twin_workload import CLUSTERS, ENV, workload
from coorm.launchers.live import START_LAG

ADAPTIVE = ("cem", "moldable")


def summary(live: twin_live.LiveRun, specs) -> dict:
    kinds = {s.name: s.kind for s in specs}
    mine = [r for r in live.requests if kinds[r["name"]] in ADAPTIVE]
    per = collections.Counter(r["name"] for r in mine)
    started = [r for r in mine if r["start"] is not None]
    notify = live.delays["notify"]
    return {
        "wall_s": round(live.wall, 1),
        "not_completed": [s.name for s in specs if not completed(live.apps[s.name], s)],
        "adaptive_requests": len(mine),
        "most_requests": per.most_common(3),
        "started": len(started),
        "started_and_ended_within_1s": sum(1 for r in started if r["end"] is not None and r["end"] - r["start"] < 1.0),
        "notify_mean_s": round(sum(notify) / len(notify), 3) if notify else None,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start-lag", type=float, default=START_LAG)
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--limit", type=float, default=300.0)
    args = ap.parse_args(argv)
    specs = workload(False, spaced=True)
    live = twin_live.run(specs, CLUSTERS, ENV, limit=args.limit, start_lag=args.start_lag, hold=args.hold)
    print({"start_lag": args.start_lag, "hold": args.hold, **summary(live, specs)})


if __name__ == "__main__":
    main()
