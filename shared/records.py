"""``typing.NamedTuple``'s class syntax without importing ``typing`` (5 ms) or ``collections`` (4 ms), for the
modules the command line's hot paths import (``coorm batch`` runs thousands of times). Type checkers see
``typing.NamedTuple`` itself: use it as ``if TYPE_CHECKING: from typing import NamedTuple`` / ``else: from
coorm.shared.records import NamedTuple``."""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's)
if TYPE_CHECKING:
    from collections.abc import Callable

try:  # the C field reader namedtuple itself uses
    from _collections import _tuplegetter  # type: ignore[import-not-found]
except ImportError:  # (not CPython)
    def _tuplegetter(index: int, doc: str) -> property:
        return property(lambda self: self[index], doc=doc)


def _maker(name: str, fields: tuple[str, ...], defaults: dict[str, object]) -> Callable[..., tuple[object, ...]]:
    """The class's ``__new__``: positional then keyword arguments, the defaults for the rest, and namedtuple's
    errors for what does not fit."""

    def __new__(cls: type, *args: object, **kwargs: object) -> tuple[object, ...]:
        if len(args) > len(fields):
            raise TypeError(f"{name}() takes {len(fields)} arguments, {len(args)} given")
        values = list(args)
        for f in fields[len(args):]:
            if f in kwargs:
                values.append(kwargs.pop(f))
            elif f in defaults:
                values.append(defaults[f])
            else:
                raise TypeError(f"{name}() missing argument {f!r}")
        if kwargs:
            raise TypeError(f"{name}() got unexpected or repeated arguments {sorted(kwargs)}")
        return tuple.__new__(cls, values)

    return __new__


class _Methods(tuple[object, ...]):
    """What namedtuple gives its classes, that our callers use."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def _asdict(self) -> dict[str, object]:
        return dict(zip(self._fields, self, strict=True))

    def _replace(self, **changes: object) -> _Methods:
        make: Callable[..., _Methods] = type(self)
        new = make(*[changes.pop(f, v) for f, v in zip(self._fields, self, strict=True)])
        if changes:
            raise ValueError(f"unexpected field names: {sorted(changes)}")
        return new

    def __getnewargs__(self) -> tuple[object, ...]:  # pickling
        return tuple(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={v!r}' for f, v in zip(self._fields, self, strict=True))})"


class _Record(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, object]) -> type:
        if not bases:  # NamedTuple itself
            return super().__new__(mcls, name, bases, ns)
        annotations = ns.get("__annotations__")
        fields = tuple(str(f) for f in annotations) if isinstance(annotations, dict) else ()
        given = [f for f in fields if f in ns]
        if given != list(fields[len(fields) - len(given):]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        defaults = {f: ns[f] for f in given}
        body = {k: v for k, v in ns.items() if k not in given}
        body.update({f: _tuplegetter(i, f"field {i}: {f}") for i, f in enumerate(fields)})
        body.update(__slots__=(), _fields=fields, _field_defaults=defaults,
                    __new__=_maker(name, fields, defaults), __match_args__=fields)
        return type(name, (_Methods,), body)


class NamedTuple(metaclass=_Record):
    """Subclass it as ``typing.NamedTuple``: annotated fields, defaults, methods; the class made is a tuple
    with namedtuple's ``_fields``, ``_field_defaults``, ``_asdict``, ``_replace``, repr and pickling."""
