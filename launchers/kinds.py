"""The shipped launchers, by kind: what the command line, the live demo and the RMS's metrics know of each,
in one table (tests/launchers/test_kinds.py checks it against the launcher classes). Light: it imports no
launcher until one is asked for."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherKind:
    name: str
    where: str  # module:class under coorm.launchers
    live_views: bool  # a live session of this kind asks for views (a rigid job's need is known: it needs none)
    preemptive_views: bool  # it follows its preemptive view (malleable)
    command_is_work: bool  # ``coorm launch KIND -- cmd``: the command is its work, whose end ends it

    def launcher_class(self) -> type:
        module, cls = self.where.split(":")
        return getattr(importlib.import_module(f"coorm.launchers.{module}"), cls)


KINDS: tuple[LauncherKind, ...] = (
    LauncherKind("rigid", "rigid:RigidLauncher", live_views=False, preemptive_views=False, command_is_work=True),
    LauncherKind("moldable", "moldable:MoldableLauncher", live_views=True, preemptive_views=False,
                 command_is_work=True),
    LauncherKind("cem", "cem:CEMLauncher", live_views=True, preemptive_views=False, command_is_work=True),
    LauncherKind("psa", "psa:PSALauncher", live_views=True, preemptive_views=True, command_is_work=False),
    LauncherKind("amr", "amr:AMRLauncher", live_views=True, preemptive_views=False, command_is_work=False),
    LauncherKind("next", "next_chain:NextChainLauncher", live_views=True, preemptive_views=False,
                 command_is_work=False),
    LauncherKind("malleable", "malleable:MalleableLauncher", live_views=True, preemptive_views=True,
                 command_is_work=False),
)
NAMES: tuple[str, ...] = tuple(k.name for k in KINDS)
BY_NAME: dict[str, LauncherKind] = {k.name: k for k in KINDS}
