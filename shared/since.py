"""Times as users type them for ``--since`` (``coorm usage``, ``coorm history``): light, for the command line."""

from __future__ import annotations

import re
from datetime import datetime

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_since(text: str, now: float) -> float:
    """A start time in epoch seconds from what a user types: a duration back from ``now`` (``90s``,
    ``15m``, ``2h``, ``1d``, ``1w``, or combined: ``1h30m``), an ISO date or date-time (``2024-05-01``,
    ``2024-05-01T12:00``, ``2024-05-01T12:00:00+02:00``, ``...Z``; without a zone: local time), or epoch
    seconds (a bare number). Raises ``ValueError`` with a readable message otherwise."""
    s = text.strip()
    if _DURATION.fullmatch(s.lower()):
        return now - sum(float(n) * _UNITS[u] for n, u in _PART.findall(s.lower()))
    if _NUMBER.fullmatch(s):
        return float(s)
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        pass
    raise ValueError(f"cannot read {text!r} as a time: give a duration back from now (90m, 2h, 1d, 1w, 1h30m), "
                     "an ISO date or date-time (2024-05-01, 2024-05-01T12:00), or epoch seconds")
