"""KOALA Fig. 8: FPSMA against EGS with precedence to waiting applications (PWA: a job that cannot be placed
shrinks running malleable ones, mandatorily), workloads W'm and W'mr, 30 s between arrivals. See
:mod:`coorm.experiments.koala`."""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import koala

NAME = "koala-pwa"
PAPER = ("Under load many jobs are stuck at their minimal size, more so with EGS (load balancing); GADGET 2 "
         "runs about 30 % longer than under PRA; the response time is far worse for EGS with W'm (a higher "
         "wait): favouring long-running jobs, FPSMA keeps the load lower.")


def run(out: Path, quick: bool = False) -> list[dict]:
    return koala.run_precedence(NAME, "waiting", 30.0, out, quick)


def markdown(rows: list[dict]) -> dict[str, str]:
    return koala.markdown_for(NAME, rows, "waiting", PAPER)


def run_live(out: Path, quick: bool = False) -> list[dict]:
    """The same launchers over ``coorm up``, at a reduced size (:mod:`coorm.experiments.koala_live`)."""
    from coorm.experiments import koala_live

    return koala_live.run_live(NAME, "waiting", 30.0, out, quick)


def live_markdown(rows: list[dict]) -> str:
    from coorm.experiments import koala_live

    return koala_live.table(rows)
