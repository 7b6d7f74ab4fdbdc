"""Observers of a journal: the hook that tracing (walj.integrations.otel) and metrics plug into,
called at fixed points of a dispatch and after each resolution, never able to change an outcome.

The points, for every dispatch that got past its argument checks (a call refused with TypeError
or UnknownToolError before anything was written is not observed):

- `on_start(context)`: before the replay check and the intent, in the caller's thread (in
  `adispatch`, in the caller's task), so an observer may make its own context current for the
  handler;
- `on_end(end)`: once the terminal record is durable (or the blocked, replayed or refused
  record written, or a call that needs approval answered without running), or once an
  interrupted dispatch has done its recovery work, in that same thread or task, before
  dispatch returns or raises;
- `on_resolved(resolution)`: once a resolution (a person's, a policy's or a reconcile hook's)
  is durable, outside the journal's locks.

An observer's `Exception` is caught and logged (logger `walj.journal`, level WARNING, with its
traceback) and changes nothing: the call's outcome and records are what they would be without
it. An interrupt (KeyboardInterrupt, SystemExit) inside an observer propagates like one that
lands at that point of dispatch without observers: `on_start` runs before anything is written
and `on_end` after the terminal record, both inside the dispatch's own interrupt handling.
Without observers, a dispatch pays for one attribute check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from ._records import Resolution
from ._tools import ToolContext, ToolResult

logger = logging.getLogger("walj.journal")

HOOKS = ("on_start", "on_end", "on_resolved")


class ExecutionEnd(NamedTuple):
    """What `on_end` is told about one dispatch.

    `outcome`: "ok", "error", "cancelled", "blocked", "refused", "awaiting_approval", "denied"
    or "approval_expired" as in the result (whose `replayed` says it was answered from a
    settled call's record, and `approval_id` names the approval it awaits, was answered by, or
    ran on). When dispatch raised,
    what the journal recorded or queued for it: "ambiguous" while the execution blocks (an
    interrupt, a cancellation while the handler ran, `ToolOutcomeUnknown`, a terminal record
    that could not be written), a terminal record's outcome if one had landed, and "cancelled"
    when the handler never ran (an interrupt before the intent was written, or a cancelled
    `adispatch` whose intent was still being written). `result`: what dispatch returned, None
    when it raised. `error`: the handler's exception (error, cancelled, blocked by
    `ToolBlocked`), or what made dispatch raise; None otherwise."""

    context: ToolContext
    outcome: str
    result: ToolResult | None
    error: BaseException | None


class ToolObserver(Protocol):
    """Told about every execution and resolution of a journal; see the module's docstring.
    Subclass it to implement only some hooks: the others do nothing. `on_end` may come for an
    execution whose `on_start` was cut short by an interrupt: ignore ids you do not know."""

    def on_start(self, context: ToolContext) -> None:
        return None

    def on_end(self, end: ExecutionEnd) -> None:
        return None

    def on_resolved(self, resolution: Resolution) -> None:
        return None


def check_observers(observers: Iterable[Any]) -> tuple[ToolObserver, ...]:
    """The observers as a tuple, or TypeError naming the first that lacks a hook."""
    if isinstance(observers, (str, bytes, Mapping)) or not isinstance(observers, Iterable):
        raise TypeError("observers must be an iterable of walj.journal.ToolObserver objects")
    checked = tuple(observers)
    for observer in checked:
        missing = [hook for hook in HOOKS if not callable(getattr(observer, hook, None))]
        if missing:
            raise TypeError(f"observer {type(observer).__name__} has no {', '.join(missing)}: "
                            "an observer has on_start, on_end and on_resolved (subclass "
                            "walj.journal.ToolObserver to get the ones you leave out)")
    return checked


def _call(observer: ToolObserver, hook: str, event: Any) -> None:
    try:
        getattr(observer, hook)(event)
    except Exception:  # an observer never changes an outcome; an interrupt goes on
        logger.warning("walj observer %s raised in %s; the call's outcome is unchanged",
                       type(observer).__qualname__, hook, exc_info=True)


class Observation:
    """One dispatch as its observers see it: started once, ended once (the first end wins, so
    an interrupt inside `on_end` does not end it a second time from dispatch's handler)."""

    __slots__ = ("context", "ended", "observers")

    def __init__(self, observers: tuple[ToolObserver, ...], context: ToolContext) -> None:
        self.observers = observers  # this dispatch's own: adding one meanwhile changes nothing
        self.context = context
        self.ended = False

    def start(self) -> None:
        for observer in self.observers:
            _call(observer, "on_start", self.context)

    def end(self, result: ToolResult, error: BaseException | None) -> None:
        self._end(ExecutionEnd(self.context, result.outcome, result, error))

    def abort(self, record: Mapping[str, Any] | None, still_open: bool,
              error: BaseException) -> None:
        """Dispatch raised. `still_open`: the execution blocks now; `record`: the terminal
        record it built or queued, if any; neither: the handler never ran."""
        if still_open:
            outcome = "ambiguous"
        elif record is None:
            outcome = "cancelled"  # no intent was written, so nothing ran
        else:
            outcome = str(record.get("outcome", "ambiguous"))
        self._end(ExecutionEnd(self.context, outcome, None, error))

    def _end(self, end: ExecutionEnd) -> None:
        if self.ended:
            return
        self.ended = True
        for observer in reversed(self.observers):  # last started, first ended: nesting holds
            _call(observer, "on_end", end)


def resolved(observers: tuple[ToolObserver, ...], resolution: Resolution) -> Resolution:
    """Tell each observer of a durable resolution; returns it."""
    for observer in observers:
        _call(observer, "on_resolved", resolution)
    return resolution
