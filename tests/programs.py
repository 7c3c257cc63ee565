"""Programs some tests need that Python's packages do not ship (Debian's ``prometheus`` gives ``promtool``
and ``prometheus``). On a machine without them those tests skip and say how to get them; ``.ci/run``
installs them and sets ``COORM_TESTS_NEED_PROGRAMS=1``, which turns such a skip into a failure, so that CI
runs every test."""

from __future__ import annotations

import os
import shutil

import pytest

INSTALL = {"promtool": "apt-get install prometheus", "prometheus": "apt-get install prometheus"}


def program(name: str) -> str:
    """The path of ``name``; skips the calling test when it is missing (fails under CI)."""
    path = shutil.which(name)
    if path is None:
        why = f"needs {name}: {INSTALL.get(name, 'install it')} (.ci/run does)"
        if os.environ.get("COORM_TESTS_NEED_PROGRAMS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path
