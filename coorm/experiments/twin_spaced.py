"""The twin with arrivals spaced beyond the live system's decision latency (``coorm experiment twin-spaced``).

The scenario of :mod:`.twin` -- the same applications, drawn the same way -- with each arrival at least
:data:`~.twin_workload.MIN_GAP` after the one before (the mean gap unchanged): no two sessions race to the
policy core, which in the unspaced scenario forks the live runs' schedules (two rigid jobs 30 ms apart start
in either order). What forks it still (an adaptive launcher's choice on whichever view it saw last, ends a
fraction of a second apart) is measured the same way: two live runs, the noise floor, the tolerance over the
applications both live runs start alike.
"""

from __future__ import annotations

from pathlib import Path

from coorm.experiments import twin

NAME = "twin-spaced"


def run(out: Path, quick: bool = False) -> list[dict]:
    return twin.run(out, quick, spaced=True, name=NAME)


def markdown(rows: list[dict]) -> dict[str, str]:
    return twin.markdown(rows, prefix=NAME)
