"""CooRM: a resource management system where rigid, moldable, malleable and evolving applications
cooperate with the RMS through their launchers.

``import coorm`` is cheap: the SDK's names (``coorm.Session``, ``coorm.RequestSpec``...) are loaded on
first use, so that the services and the command line, which live in this package too, do not pay for it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (not typing's: every coorm command imports this package; typing costs 5 ms)

__version__ = "0.1.0"

__all__ = ["Closed", "ErrorCode", "Event", "Exited", "Killed", "ReplaceRefused", "RequestSpec", "RequestType",
           "RMSStopped", "Session", "SessionClosed", "SessionReaped", "Started", "SyncSession", "ViewsChanged",
           "WireError", "__version__"]

if TYPE_CHECKING:
    from typing import Any

    from coorm.sdk import (
        Closed,
        ErrorCode,
        Event,
        Exited,
        Killed,
        ReplaceRefused,
        RequestSpec,
        RequestType,
        RMSStopped,
        Session,
        SessionClosed,
        SessionReaped,
        Started,
        SyncSession,
        ViewsChanged,
        WireError,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("coorm.sdk"), name)
    raise AttributeError(f"module 'coorm' has no attribute {name!r}")
