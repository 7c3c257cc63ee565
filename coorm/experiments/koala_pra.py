"""KOALA Fig. 7: FPSMA against EGS with precedence to running applications (PRA: malleable jobs are never
shrunk for waiting ones), workloads Wm and Wmr, 2 min between arrivals. See :mod:`coorm.experiments.koala`."""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import koala

NAME = "koala-pra"
PAPER = ("EGS gives malleable jobs more processors than FPSMA, on average and at their maximum (with FPSMA, "
         "short jobs end before it is their turn to grow); EGS leads to a higher utilisation with Wm; more grow "
         "operations with Wm than with Wmr, and with EGS than with FPSMA.")


def run(out: Path, quick: bool = False) -> list[dict]:
    return koala.run_precedence(NAME, "running", 120.0, out, quick)


def markdown(rows: list[dict]) -> dict[str, str]:
    return koala.markdown_for(NAME, rows, "running", PAPER)


def run_live(out: Path, quick: bool = False) -> list[dict]:
    """The same launchers over ``coorm up``, at a reduced size (:mod:`coorm.experiments.koala_live`)."""
    from coorm.experiments import koala_live

    return koala_live.run_live(NAME, "running", 120.0, out, quick)


def live_markdown(rows: list[dict]) -> str:
    from coorm.experiments import koala_live

    return koala_live.table(rows)
