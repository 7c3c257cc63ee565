"""KOALA Fig. 7 on a busier platform: ``koala-pra`` (FPSMA against EGS, precedence to running applications,
W'm and W'mr, DAS3 with worst-fit) at the paper's 2 min between arrivals and at koala-pwa's 30 s, each with
and without other users' rigid jobs (:func:`coorm.experiments.koala.background_jobs`, as in
``koala-pwa-load``). ``--live`` runs the busier set-up (W'm 30 s apart, without and with other users' jobs at
90 %) over ``coorm up`` at koala-pra/pwa's reduced size (:mod:`coorm.experiments.koala_live`).

Why: at the paper's set-up ``koala-pra`` finds FPSMA and EGS the same to the last digit -- a malleable job
runs about 160 s and one arrives every 120 s, so worst-fit finds each a cluster of its own, where it grows
once to its maximum whatever the policy. The paper's differences (EGS gives jobs more processors, on average
and at their maximum, and grows them more often) need two jobs growing on one cluster at once; this
experiment makes the platform busy enough for that and checks the paper's statements at each step. The rows
at 120 s without load are koala-pra's DAS3 rows (its first two seeds)."""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import koala
from coorm.experiments.koala_pwa_load import WORKERS, loads_markdown, run_loads

NAME = "koala-pra-load"
PAPER = ("EGS gives malleable jobs more processors than FPSMA, on average and at their maximum (with FPSMA, "
         "short jobs end before it is their turn to grow); EGS leads to a higher utilisation with Wm; more grow "
         "operations with Wm than with Wmr, and with EGS than with FPSMA.")
INTERARRIVALS = (120.0, 30.0)  # koala-pra's (the paper's Fig. 7), koala-pwa's
LOADS = (0.0, 0.5, 0.9)  # other users' nominal load on each cluster, as koala-pwa-load's
SEEDS = 2  # as koala-pwa-load (a budget choice: a run at 90 % costs some ten times one without)
QUICK = (60, 1, (30.0,), (0.0, 0.9))  # jobs, seeds, inter-arrivals, loads


def run(out: Path, quick: bool = False, workers: int = WORKERS) -> list[dict]:
    jobs, seeds, interarrivals, loads = QUICK if quick else (koala.FULL[0], SEEDS, INTERARRIVALS, LOADS)
    return run_loads(NAME, "running", interarrivals, loads, jobs, seeds, out, workers)


def markdown(rows: list[dict]) -> dict[str, str]:
    table, checks = loads_markdown(rows, "running")
    r0 = rows[0]
    seeds = f"{r0['seeds']} seed{'s' if r0['seeds'] != 1 else ''}"
    return {NAME: f"**Paper:** {PAPER}\n\nOurs: {r0['jobs']} jobs, means over {seeds}; DAS3's five clusters "
                  f"({r0['nodes']} nodes), each KOALA job placed by worst-fit, {koala.THRESHOLD} nodes of each "
                  "cluster kept for local users; jobs 120 s apart (the paper's) or 30 s apart, other users' rigid "
                  "jobs on every cluster at the nominal load shown (in brackets: what the drawn jobs offer). "
                  "Utilisation counts every job, other users' too.\n\n" + table + "\n\n" + checks}


LIVE_INTERARRIVAL = 30.0  # the busier of the two: where the policies differ
LIVE_LOADS = (0.0, 0.9)


def run_live(out: Path, quick: bool = False) -> list[dict]:
    """The same launchers over ``coorm up`` at koala-pra/pwa's reduced size, W'm 30 s apart (divided by the
    speed-up), without and with other users' jobs (quick: EGS only)."""
    from coorm.experiments import koala_live

    policies = ("egs",) if quick else koala.POLICIES
    return koala_live.run_live(NAME, "running", LIVE_INTERARRIVAL, out, quick, policies=policies, workload="Wm",
                               loads=LIVE_LOADS)


def live_markdown(rows: list[dict]) -> str:
    from coorm.experiments import koala_live

    return koala_live.load_table(rows)
