"""``bus.decode``, the one way a message is read: whatever the bytes, a model or a ``WireError`` that says why
-- never another exception (a RecursionError was one), never ``NaN`` or an infinity in a model. And an error's
message is bounded and encodable whatever it quotes. (Over the wire: tests/live/test_bad_input.py and
tests/live/test_fuzz.py.)"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coorm.shared import bus
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import KillMsg, ViewsEpoch


def refused(data: bytes, model=KillMsg) -> str:
    with pytest.raises(bus.WireError) as e:
        bus.decode(data, model)
    assert e.value.code is ErrorCode.BAD_MESSAGE
    return e.value.message


def nested(depth: int) -> bytes:
    """``{"request": "r", "reason": ...}`` whose reason nests ``depth`` levels (the message itself is one)."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b'{"request": "r", "reason": ' + inner + b"}"


def test_nesting_up_to_the_limit_is_parsed_and_beyond_it_refused_before_parsing():
    assert "reason" in refused(nested(bus.MAX_DEPTH))  # parsed: the model refuses a list for a string
    assert "nested" in refused(nested(bus.MAX_DEPTH + 1))
    assert "nested" in refused(b"[" * 1_000_000 + b"]" * 1_000_000)
    assert "nested" in refused(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    assert "nested" in refused(b"[" * 1_000_000)  # never closed


@pytest.mark.parametrize("text", ["[" * 40, "\\", '"' + "[" * 40, "\\" * 3 + '"' + "{" * 40])
def test_brackets_inside_strings_are_not_nesting(text):
    data = json.dumps({"request": "r", "reason": text}).encode()  # escaped quotes and backslashes included
    assert bus.decode(data, KillMsg).reason == text


def test_a_big_message_of_many_shallow_parts_is_read():
    views = {f"a{i}": {"c0": {"non_preemptive": [[1767225600.0 + j, j] for j in range(20)]}} for i in range(2000)}
    data = json.dumps({"epoch": 1, "now": 1767225600.0, "views": views}).encode()
    assert data.count(b"[") > bus.MAX_DEPTH and len(bus.decode(data, ViewsEpoch).views) == 2000


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999",
                                    b"1" + b"0" * 400 + b".0"])
def test_numbers_must_be_finite_json_numbers(number):
    assert "not JSON" in refused(b'{"request": "r", "grace": ' + number + b"}")


def test_finite_numbers_are_read():
    assert bus.decode(b'{"request": "r", "grace": 1e308}', KillMsg).grace == 1e308
    assert bus.decode(b'{"request": "r", "grace": 5e-324}', KillMsg).grace == 5e-324


def test_a_message_bigger_than_any_is_refused_before_parsing():
    assert "bytes" in refused(b" " * (bus.MAX_MESSAGE_BYTES + 1))


def test_an_error_message_is_bounded_and_encodable_whatever_it_quotes():
    message = refused(json.dumps({"\ud800" + "k" * 1_000_000: 1}).encode())  # a huge field name, a lone surrogate
    assert len(message) <= bus.MAX_ERROR_CHARS + 3
    reply = bus.encode(bus.WireError(ErrorCode.BAD_MESSAGE, "\ud800" * 10).reply())
    assert b"\\\\ud800" in reply


@given(st.binary(max_size=200))
def test_any_bytes_give_a_model_or_a_refusal(data):
    try:
        bus.decode(data, KillMsg)
    except bus.WireError as e:
        assert e.code is ErrorCode.BAD_MESSAGE
