"""``typing.NamedTuple``'s class syntax without importing ``typing`` (5 ms), for the modules the command
line's hot paths import (``coorm batch`` runs thousands of times). Type checkers see ``typing.NamedTuple``
itself: use it as ``if TYPE_CHECKING: from typing import NamedTuple`` / ``else: from
coorm.shared.records import NamedTuple``."""

from __future__ import annotations

from collections import namedtuple


class _Record(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, object]) -> type:
        if not bases:  # NamedTuple itself
            return super().__new__(mcls, name, bases, ns)
        fields = list(ns.get("__annotations__", {}))  # type: ignore[call-overload]
        given = [f for f in fields if f in ns]
        if given != fields[len(fields) - len(given):]:
            raise TypeError(f"{name}: a field without a default follows one with a default")
        base = namedtuple(name, fields, defaults=[ns[f] for f in given])  # type: ignore[misc]
        body = {k: v for k, v in ns.items() if k not in given}
        return type(name, (base,), {**body, "__slots__": ()})


class NamedTuple(metaclass=_Record):
    """Subclass it as ``typing.NamedTuple``: annotated fields, defaults, methods; the class made is a
    ``collections.namedtuple``'s subclass (``_replace``, ``_asdict``, ``_fields``, pickling)."""
