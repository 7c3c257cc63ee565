"""Times as users type them: walltimes (``-t``) and ``--since`` (``coorm usage``, ``coorm history``). Light (the
standard library only), for the command line's hot paths."""

from __future__ import annotations

import re

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
    from datetime import datetime

    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        pass
    raise ValueError(f"cannot read {text!r} as a time: give a duration back from now (90m, 2h, 1d, 1w, 1h30m), "
                     "an ISO date or date-time (2024-05-01, 2024-05-01T12:00), or epoch seconds")


def parse_walltime(text: str) -> float:
    """A walltime the way Slurm users write it: ``90`` (minutes), ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``; or with a unit: ``30s``, ``10m``, ``2h``, ``1d``, ``1.5h``."""
    t = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", t)
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
        if not m:
            raise ValueError(f"cannot read the walltime {text!r}: try 10m, 2h, 90 (minutes), 1:30:00, 1-12")
        days, b, c = (int(x) if x is not None else None for x in (m.group(1), m.group(3), m.group(4)))
        a = int(m.group(2))
        if days is not None:  # D-HH[:MM[:SS]]
            seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
        elif c is not None and b is not None:  # HH:MM:SS
            seconds = a * 3600 + b * 60 + c
        elif b is not None:  # MM:SS
            seconds = a * 60 + b
        else:  # minutes
            seconds = a * 60
    if seconds <= 0:
        raise ValueError(f"the walltime must be positive, not {text!r}")
    return float(seconds)
