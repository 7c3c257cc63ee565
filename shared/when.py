"""Times as users type them: walltimes (``-t``) and ``--since`` (``coorm usage``, ``coorm history``). Light (the
standard library only), for the command line's hot paths."""

from __future__ import annotations

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = r"(?:\d+(?:\.\d+)?[smhdw])+"
_PART = r"(\d+(?:\.\d+)?)([smhdw])"


def parse_since(text: str, now: float) -> float:
    """A start time in epoch seconds from what a user types: a duration back from ``now`` (``90s``,
    ``15m``, ``2h``, ``1d``, ``1w``, or combined: ``1h30m``), an ISO date or date-time (``2024-05-01``,
    ``2024-05-01T12:00``, ``2024-05-01T12:00:00+02:00``, ``...Z``; without a zone: local time), or epoch
    seconds (a bare number). Raises ``ValueError`` with a readable message otherwise."""
    s = text.strip()
    if _decimal(s):  # (before the durations, which all have a unit: epoch seconds need no re)
        return float(s)
    import re  # (not at the top: coorm batch reads walltimes through this module, and re costs it 10 ms)

    if re.fullmatch(_DURATION, s.lower()):
        return now - sum(float(n) * _UNITS[u] for n, u in re.findall(_PART, s.lower()))
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
    if t[-1:] in ("s", "m", "h", "d") and _decimal(t[:-1]):
        seconds = float(t[:-1]) * _UNITS[t[-1]]
    else:
        day_text, dash, clock = t.rpartition("-")
        fields = clock.split(":")
        if (dash and not digits(day_text)) or len(fields) > 3 or not all(digits(f) for f in fields):
            raise ValueError(f"cannot read the walltime {text!r}: try 10m, 2h, 90 (minutes), 1:30:00, 1-12")
        days = int(day_text) if dash else None
        numbers = [int(f) for f in fields]
        a = numbers[0]
        b = numbers[1] if len(numbers) > 1 else None
        c = numbers[2] if len(numbers) > 2 else None
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


def digits(text: str) -> bool:
    """``[0-9]+``: str.isdigit alone also takes other scripts' digits and superscripts. (String tests, not
    regular expressions, here and in :mod:`coorm.batch.jobscript`: ``coorm batch`` reads walltimes and
    options on every call, and importing re costs it 10-15 ms.)"""
    return text.isascii() and text.isdigit()


def _decimal(text: str) -> bool:
    """``[0-9]+(\\.[0-9]+)?``"""
    whole, dot, fraction = text.partition(".")
    return digits(whole) and (not dot or digits(fraction))
