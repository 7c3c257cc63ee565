"""The launcher SDK under its short name: ``from coorm.sdk import Session``.

Everything an application needs to talk to CooRM -- :class:`Session` (asyncio) and :class:`SyncSession`,
the events a session delivers, the request specification and the error a refused message raises. The
implementation lives in :mod:`coorm.launchers.sdk`; this module only names it."""

from coorm.launchers.sdk import Closed, Event, Exited, Killed, Session, Started, SyncSession, ViewsChanged
from coorm.shared.bus import WireError
from coorm.shared.events import ErrorCode
from coorm.shared.requests import RequestSpec, RequestType

__all__ = ["Closed", "ErrorCode", "Event", "Exited", "Killed", "RequestSpec", "RequestType", "Session",
           "Started", "SyncSession", "ViewsChanged", "WireError"]
