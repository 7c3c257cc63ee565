"""The table of shipped launcher kinds (launchers/kinds.py) is the launchers': each row names a class whose
``kind`` is the row's, every launcher class of the package has a row, and a scenario may use each kind."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import coorm.launchers
from coorm.launchers.base import Launcher
from coorm.launchers.kinds import KINDS, NAMES
from coorm.simulator import scenario


def test_each_row_names_its_class():
    for k in KINDS:
        cls = k.launcher_class()
        assert issubclass(cls, Launcher) and cls.kind == k.name, k


def test_every_launcher_class_of_the_package_has_a_row():
    found = set()
    for mod in pkgutil.iter_modules(coorm.launchers.__path__):
        module = importlib.import_module(f"coorm.launchers.{mod.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Launcher) and cls.__module__ == module.__name__ and "kind" in vars(cls):
                found.add(cls.kind)
    found.discard("launcher")  # the base class
    assert found == set(NAMES)


def test_a_scenario_may_use_each_kind():
    union = typing.get_args(scenario.AppSpec)[0]
    kinds = {typing.get_args(spec.model_fields["kind"].annotation)[0] for spec in typing.get_args(union)}
    assert kinds == set(NAMES)
