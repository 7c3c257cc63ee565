"""JSON for the command line's hot paths, by the C functions :mod:`json` itself calls, without importing
:mod:`json`: its decoder imports :mod:`re` (10-15 ms of a ``coorm batch``'s 60, more on a loaded login
node), to match the whitespace around a document, which is done here with ``str.strip``.

``loads`` and ``dumps`` give what ``json.loads`` and ``json.dumps`` give (compact separators aside) --
``tests/core/test_lightjson.py`` holds them to it; where the interpreter has no ``_json`` or its functions
take other arguments, they are ``json``'s own."""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: see coorm.shared.connection)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"  # JSON's (RFC 8259): no other character may surround a document


class _Context:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder``, set as the default decoder's."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:  # NaN, Infinity, -Infinity: float() reads JSON's spellings
        return float(name)


def _c_functions() -> tuple[Callable[[str, int], tuple[Any, int]], Callable[[Any, int], Any]] | None:
    try:
        from _json import encode_basestring_ascii, make_encoder, make_scanner
        scan = make_scanner(_Context())  # type: ignore[arg-type]  # (it reads these attributes only)
        # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
        encode = make_encoder({}, _not_serializable, encode_basestring_ascii, None, ":", ",", False, False, True)
        encode({"a": [1, 2.5, None, True, "é"]}, 0)  # (another interpreter's signature fails here, not later)
        scan('{"a": [1]}', 0)
    except (ImportError, TypeError, AttributeError):  # pragma: no cover - not CPython 3.11-3.13
        return None
    return scan, encode


def _not_serializable(o: object) -> object:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


_C = _c_functions()


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``; a document that is not JSON raises ``ValueError`` (``json.JSONDecodeError``)."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if _C is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _C[0](text, start)
    except StopIteration as e:  # (what the scanner raises where no value starts)
        raise _error("Expecting value", text, e.value) from None
    if text[end:].strip(_WHITESPACE):
        raise _error("Extra data", text, end + len(text[end:]) - len(text[end:].lstrip(_WHITESPACE)))
    return value


def dumps(value: Any) -> str:
    """``json.dumps(value, separators=(",", ":"))``: ASCII, compact."""
    if _C is None:  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"))
    return "".join(_C[1](value, 0))


def dumps_indented(value: Any, indent: int = 2, _level: int = 0) -> str:
    """``json.dumps(value, indent=indent)`` (what the full command line's ``--json`` prints): containers laid
    out here, every other value by the compact encoder."""
    if isinstance(value, dict) and value:
        inner, outer = " " * (indent * (_level + 1)), " " * (indent * _level)
        items = (f"{inner}{dumps(_key(k))}: {dumps_indented(v, indent, _level + 1)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + "\n" + outer + "}"
    if isinstance(value, (list, tuple)) and value:
        inner, outer = " " * (indent * (_level + 1)), " " * (indent * _level)
        return "[\n" + ",\n".join(f"{inner}{dumps_indented(v, indent, _level + 1)}" for v in value) + "\n" + outer + "]"
    return dumps(value)


def _key(k: Any) -> str:
    """A key as ``json`` writes it: a string, or a number, boolean or null spelled as one."""
    if isinstance(k, str):
        return k
    if k is None or isinstance(k, (int, float)):  # (bool is an int)
        return dumps(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def _error(message: str, text: str, position: int) -> ValueError:
    import json  # (only for a document that is not JSON: the error json itself raises)

    return json.JSONDecodeError(message, text, position)
