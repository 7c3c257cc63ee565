"""Every shipped launcher's parameters can be set from a scenario file and from ``coorm launch KIND --set
k=v`` (both read the same application specs): a parameter a launcher gains must be given a field."""

from __future__ import annotations

import inspect
import typing

import pytest

from coorm.launchers.amr import AMRLauncher
from coorm.launchers.cem import CEMLauncher
from coorm.launchers.moldable import MoldableLauncher
from coorm.launchers.next_chain import NextChainLauncher
from coorm.launchers.psa import PSALauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.simulator import scenario

# (the spec, the launcher, the parameters that are not the user's: the application id, and the cluster that the
# spec's own ``cluster`` (or the first cluster) gives)
CASES = [
    (scenario.RigidApp, RigidLauncher, {"app", "cluster"}),
    (scenario.MoldableApp, MoldableLauncher, {"app", "cluster"}),
    (scenario.PsaApp, PSALauncher, {"app", "cluster"}),
    (scenario.AmrApp, AMRLauncher, {"app", "cluster"}),
    (scenario.NextApp, NextChainLauncher, {"app", "cluster"}),
]


@pytest.mark.parametrize(("spec", "launcher", "implicit"), CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_every_parameter_of_a_launcher_is_a_field_of_its_spec(spec, launcher, implicit):
    params = set(inspect.signature(launcher.__init__).parameters) - {"self"} - implicit
    missing = params - set(spec.model_fields)
    assert not missing, f"{launcher.__name__}: not settable: {sorted(missing)}"


def test_the_cem_spec_passes_any_of_its_parameters_through():
    params = set(inspect.signature(CEMLauncher.__init__).parameters) - {"self", "app", "adaptation_delay"}
    launcher = scenario.make_launcher("a1", scenario.CemApp(kind="cem", params={"runtime_fraction": 0.5,
                                                                                 "max_starts": 3}), "c0", None)
    assert (launcher.max_starts, launcher.runtime_fraction) == (3, 0.5) and "max_starts" in params
    assert typing.get_type_hints(scenario.CemApp)["params"] is dict


def test_the_amr_working_set_reaches_the_launcher():
    spec = scenario.AmrApp(kind="amr", smax_mib=1024.0, mem_per_node_mib=512.0, steps=10)
    launcher = scenario.make_launcher("a1", spec, "c0", None)
    assert max(launcher.sizes) <= 1024.0 and launcher.n_eq >= 2
