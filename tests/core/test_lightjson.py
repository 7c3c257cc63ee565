"""The hot paths' JSON (coorm.shared.lightjson) reads and writes what the json module does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import coorm
from coorm.shared import lightjson

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


def test_the_c_functions_are_used_here():
    # (else every other test here checks json against itself)
    assert lightjson._C is not None


@given(documents)
def test_dumps_writes_what_json_writes(value):
    assert lightjson.dumps(value) == json.dumps(value, separators=(",", ":"))


@given(documents)
def test_dumps_indented_writes_what_json_writes_with_an_indent(value):
    assert lightjson.dumps_indented(value) == json.dumps(value, indent=2)


@given(st.dictionaries(st.one_of(st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False)),
                       st.integers(), max_size=4))
def test_dumps_indented_writes_keys_that_are_not_strings_as_json_does(value):
    assert lightjson.dumps_indented(value) == json.dumps(value, indent=2)


@given(documents, st.sampled_from(["", " ", "\n\t", "\r\n  "]))
def test_loads_reads_what_json_reads(value, space):
    text = space + json.dumps(value, ensure_ascii=False, indent=1) + space
    assert lightjson.loads(text) == json.loads(text)
    assert lightjson.loads(text.encode()) == json.loads(text)


@given(st.text(max_size=12))
def test_loads_refuses_what_json_refuses(text):
    try:
        expected = json.loads(text)
    except ValueError as e:
        with pytest.raises(ValueError) as refused:
            lightjson.loads(text)
        assert str(refused.value) == str(e)
    else:
        got = lightjson.loads(text)
        # compared as json writes them: a NaN is not equal to itself, at the top or inside (CI found '{"":NaN}')
        assert json.dumps(got) == json.dumps(expected)


@pytest.mark.parametrize("text", ["", "{", "[1,]", "1 2", '{"a":1}x', "\x0c1", "nul", "\u00a01"])
def test_documents_that_are_not_json_are_refused(text):
    with pytest.raises(ValueError):
        lightjson.loads(text)


def test_objects_json_cannot_write_are_refused():
    with pytest.raises(TypeError, match="set"):
        lightjson.dumps({"a": {1, 2}})


def test_it_does_not_import_re():
    # the point of the module: a command that reads and writes JSON through it does not pay for re
    # (-S: a development install's .pth files import re before anything of ours runs)
    code = "import sys; from coorm.shared import lightjson; lightjson.loads(lightjson.dumps({'a': [1]})); " \
           "print('re' in sys.modules, 'json' in sys.modules)"
    where = str(Path(coorm.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": where}).stdout
    assert out.split() == ["False", "False"]
