"""The twin at a few hundred applications (``coorm experiment twin-large``): CooRM Fig. 8's comparison, live
against simulated, over :data:`COUNT` applications besides the PSAs instead of :mod:`.twin`'s 120.

The same scenario (:func:`~.twin_workload.workload`: one stream of draws, so its first 122 applications are
the twin's), the same load (the same mean gap, sizes and clusters), run for longer: more forks of the live
schedule to measure the model against, and the tolerances over more applications. The quick form is the
twin's quick scenario.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import twin

NAME = "twin-large"
COUNT = 300  # applications besides the two PSAs: "a few hundred" (issue 17)


def run(out: Path, quick: bool = False) -> list[dict]:
    return twin.run(out, quick, name=NAME, count=None if quick else COUNT)


def markdown(rows: list[dict]) -> dict[str, str]:
    return twin.markdown(rows, prefix=NAME)
