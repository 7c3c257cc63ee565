"""The SDK's public names: what an application needs is importable from ``coorm.sdk`` (and ``coorm``), and
nothing of the implementation's public surface that an application meets is missing there -- the
exceptions a session ends with (``Closed.error``) above all: an application catches them by class."""

from __future__ import annotations

import inspect

import coorm
import coorm.sdk
from coorm.launchers import sdk as implementation


def test_every_name_of_the_sdk_is_there():
    for name in coorm.sdk.__all__:
        assert getattr(coorm.sdk, name) is not None, name


def test_coorm_names_only_what_the_sdk_has():
    for name in coorm.__all__:
        if name != "__version__":
            assert name in coorm.sdk.__all__, name
            assert getattr(coorm, name) is getattr(coorm.sdk, name), name


def test_every_exception_of_the_implementation_is_public():
    """An exception the implementation defines reaches applications (raised by a call, or as why a
    session closed): each must be importable from the SDK's short name and from ``coorm``."""
    here = implementation.__name__
    exceptions = [name for name, obj in vars(implementation).items()
                  if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == here
                  and not name.startswith("_")]
    assert exceptions, "the implementation should define its exceptions"
    for name in exceptions:
        assert name in coorm.sdk.__all__, name
        assert name in coorm.__all__, name
