"""The launcher SDK under its short name: ``from coorm.sdk import Session``.

Everything an application needs to talk to CooRM -- :class:`Session` (asyncio) and :class:`SyncSession`,
the events a session delivers, the request specification, a negotiation's terms (``Session.negotiate``,
``respond``, ``accept``: the adaptive-RMS paper's offers), the error a refused message raises, the one
a refused replace raises (``Session.replace``: a request it replaces has started), and why a session ended
that the application did not close (``Closed.error``: :class:`RMSStopped`, :class:`SessionReaped`,
:class:`Unreachable`) -- and what still waited on a session the application closed ends with
(:class:`SessionClosed`). The
implementation lives in :mod:`coorm.launchers.sdk`; this module only names it."""

from coorm.launchers.sdk import (
    Closed,
    Event,
    Exited,
    Killed,
    OfferReceived,
    ReplaceRefused,
    RMSStopped,
    Session,
    SessionClosed,
    SessionReaped,
    Started,
    SyncSession,
    ViewsChanged,
)
from coorm.shared.bus import Unreachable, WireError
from coorm.shared.events import ErrorCode
from coorm.shared.negotiation import Answer, NegotiationTerms, pow2_sizes
from coorm.shared.protocol import OfferMsg
from coorm.shared.requests import RequestSpec, RequestType

__all__ = ["Answer", "Closed", "ErrorCode", "Event", "Exited", "Killed", "NegotiationTerms", "OfferMsg",
           "OfferReceived", "ReplaceRefused", "RequestSpec", "RequestType", "RMSStopped", "Session", "SessionClosed",
           "SessionReaped", "Started", "SyncSession", "Unreachable", "ViewsChanged", "WireError", "pow2_sizes"]
