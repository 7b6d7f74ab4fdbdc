"""Settling interrupted work durably: resolutions by people, and on open by reconcile hooks and
per-tool on_ambiguous policies. Never a second terminal record."""

from __future__ import annotations

import unicodedata
from typing import Any

from ..errors import ResolutionError
from ..log import read
from . import _writes
from . import records as rc
from ._core import Core
from ._damage import REVIEWED, unrecorded
from ._observe import resolved as observed
from ._records import Resolution

RESOLVE_OUTCOMES = ("succeeded", "failed", "not_performed")
RECONCILE_ANSWERS = ("succeeded", "not_performed", None)
# Categories refused in an actor: control characters (newlines, escapes that could forge a
# terminal line), line and paragraph separators, and unpaired surrogates (not text).
_BAD_ACTOR_CATEGORIES = ("Cc", "Zl", "Zp", "Cs")


def check_actor(actor: Any) -> None:
    """Refuse (bad_actor) a missing or empty actor, one with control characters, and one that
    looks like an automatic actor, `policy` or `reconcile:<tool>`, once it is normalised."""
    if not issubclass(type(actor), str):
        raise ResolutionError("actor must be a non-empty string naming who resolves",
                              reason="bad_actor")
    text = str.__str__(actor)  # its characters, whatever a str subclass overrides
    if any(unicodedata.category(ch) in _BAD_ACTOR_CATEGORIES for ch in text):
        raise ResolutionError(f"actor {text!r} holds control characters, line breaks or "
                              "unpaired surrogates", reason="bad_actor")
    shape = _actor_shape(text)
    if not shape:
        raise ResolutionError("actor must be a non-empty string naming who resolves",
                              reason="bad_actor")
    if shape == "policy" or shape.startswith("reconcile:"):
        raise ResolutionError(f"actor {text!r} looks like {shape!r}, which is reserved for "
                              "automatic settlements", reason="bad_actor")


def _actor_shape(actor: str) -> str:
    """What an actor reads as, to compare with the reserved names: compatibility forms folded
    (NFKC: fullwidth letters, ligatures, a fullwidth colon), case folded, and the invisible
    left out: format characters (category Cf: zero-width spaces and joiners, soft hyphens,
    direction marks, BOM) and whitespace anywhere, so that `policy ` and
    `reconcile\\u200b:send_email` read as the automatic actors they imitate."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", actor).casefold())
    return "".join(ch for ch in folded
                   if not ch.isspace() and unicodedata.category(ch) != "Cf")


def check_signature(actor: Any, note: Any) -> None:
    """What every resolution is signed with: refuse a bad actor (check_actor), then
    (note_required) a note that is neither a string nor None."""
    check_actor(actor)
    if note is not None and not isinstance(note, str):
        raise ResolutionError("note must be a string or None", reason="note_required")


# A request a resolution answers: its id and the time it was asked, both recorded.
Request = tuple[str, float]


def _answering(record: dict[str, Any], request: Request | None) -> dict[str, Any]:
    """`record` as the answer to `request`: its id, and the time the person asked."""
    if request is not None:
        record["request"], record["at"] = request
    return record


def resolve(core: Core, execution_id: Any, outcome: Any, *, note: Any, actor: Any,
            output: Any, request: Request | None = None) -> Resolution:
    """A person's resolution of an execution, a pending LLM call or bytes recovery cut; see
    ToolJournal.resolve. `request`: the resolution request this answers, if any."""
    is_cut = isinstance(execution_id, str) and core.view(lambda s: execution_id in s.cuts.cuts)
    if is_cut or outcome == REVIEWED:
        return _resolve_cut(core, execution_id, outcome, note=note, actor=actor,
                            request=request)
    if outcome not in RESOLVE_OUTCOMES:
        raise ResolutionError(
            f"outcome must be one of {', '.join(RESOLVE_OUTCOMES)}, not {outcome!r}",
            reason="bad_outcome")
    check_signature(actor, note)
    if outcome == "failed" and not (note and note.strip()):
        raise ResolutionError("a 'failed' resolution needs a note saying what failed",
                              reason="note_required")
    return write_resolution(core, execution_id, outcome, note=note, actor=actor,
                            output=output, request=request)


def write_resolution(core: Core, execution_id: Any, outcome: str, *, note: str | None,
           actor: str, output: Any = None, request: Request | None = None) -> Resolution:
    """Write the durable resolution of an open execution or LLM call, or refuse."""
    if not isinstance(execution_id, str) or not execution_id:
        raise ResolutionError(f"unknown execution id {execution_id!r}", reason="unknown")
    # One resolution at a time, so two racing resolvers cannot both pass the check; under the
    # write lock, after the queued records, so a terminal record already decided wins.
    with core.resolving(), core.writing():
        core.write_queued()
        if core.in_flight(execution_id):
            raise ResolutionError(f"execution {execution_id} is running in this process",
                                  reason="in_flight")
        is_tool, is_llm = core.view(lambda s: (execution_id in s.executions,
                                               execution_id in s.llm_calls))
        if not (is_tool or is_llm):
            raise _not_open(core, execution_id)
        record = _answering(_writes.resolved(rc.RESOLVED if is_tool else rc.LLM_RESOLVED,
                                             execution_id, outcome, actor, note, output),
                            request)
        resolution = _resolution(core, core.write(record, durable=True))
    return observed(core.observers, resolution) if core.observers else resolution


def _resolve_cut(core: Core, quarantine_file: Any, outcome: Any, *, note: Any,
                 actor: Any, request: Request | None) -> Resolution:
    """Settle a log_damage blocker: a person has looked at the cut bytes in quarantine/ and
    settled by hand whatever they held."""
    if outcome != REVIEWED:
        raise ResolutionError(f"bytes cut from the log are resolved with outcome {REVIEWED!r}, "
                              f"once a person has looked at them, not {outcome!r}",
                              reason="bad_outcome")
    check_signature(actor, note)
    if not (note and note.strip()):
        raise ResolutionError("resolving damage needs a note saying what the cut bytes held and "
                              "what was done about it", reason="note_required")
    with core.resolving(), core.writing():
        core.write_queued()
        open_cut, known = core.view(lambda s: (quarantine_file in s.cuts.damage,
                                               quarantine_file in s.cuts.cuts))
        if not open_cut:
            if known:
                raise ResolutionError(f"cut {quarantine_file} does not block (a crash explains "
                                      "it, or it was resolved)", reason="already_resolved")
            raise ResolutionError(f"unknown blocker id {quarantine_file!r}", reason="unknown")
        record = _answering(_writes.resolved(rc.LOG_CUT_RESOLVED, quarantine_file, REVIEWED,
                                             actor, note), request)
        resolution = _resolution(core, core.write(record, durable=True))
    return observed(core.observers, resolution) if core.observers else resolution


def _resolution(core: Core, seq: int) -> Resolution:
    """The resolution the record `seq` made (the state object may have been rebuilt)."""
    for resolution in reversed(core.state.resolutions):
        if resolution.seq == seq:
            return resolution
    raise AssertionError(f"record {seq} made no resolution")  # pragma: no cover


def _not_open(core: Core, execution_id: str) -> ResolutionError:
    """Why an id is not open: resolved, terminal, or unknown. Only this error path reads the
    log again, so the state need not remember every finished execution."""
    for resolution in core.state.resolutions:
        if resolution.execution_id == execution_id:
            return ResolutionError(
                f"execution {execution_id} was already resolved ({resolution.outcome} by "
                f"{resolution.actor})", reason="already_resolved")
    terminal = (rc.FINISHED, rc.BLOCKED, rc.LLM_FINISHED)
    for record in read(core.log.path):
        data = record.data
        if data.get("kind") in terminal and rc.subject_of(data) == execution_id:
            return ResolutionError(
                f"execution {execution_id} already has a terminal record ({data.get('kind')}, "
                f"outcome {data.get('outcome', 'blocked')!r}, seq {record.seq}); there is never a "
                "second one", reason="already_terminal")
    return ResolutionError(f"unknown execution id {execution_id!r}", reason="unknown")


def resolve_turn(core: Core, turn_sequence: Any, *, note: Any, actor: Any,
                 request: Request | None = None) -> Resolution:
    """A person's resolution of an interrupted turn; see ToolJournal.resolve_turn."""
    check_signature(actor, note)
    if type(turn_sequence) is not int:
        raise ResolutionError(f"unknown turn {turn_sequence!r}", reason="unknown")
    with core.resolving(), core.writing():
        live = core.live_turn()
        if live is not None and live.sequence == turn_sequence:
            raise ResolutionError(f"turn {turn_sequence} is live", reason="in_flight")
        state = core.state
        turn = core.view(lambda s: s.turns.get(turn_sequence))
        if turn is None:
            if 1 <= turn_sequence <= state.max_turn:
                raise ResolutionError(f"turn {turn_sequence} completed",
                                      reason="already_terminal")
            raise ResolutionError(f"unknown turn {turn_sequence}", reason="unknown")
        if turn.resolved:
            raise ResolutionError(f"turn {turn_sequence} was already resolved",
                                  reason="already_resolved")
        seq = core.write(_answering(_writes.turn_resolved(turn_sequence, actor, note), request),
                         durable=True)
        resolution = _resolution(core, seq)
    return observed(core.observers, resolution) if core.observers else resolution


def record_cuts(core: Core) -> None:
    """On open: a durable log_cut record for each cut in quarantine/ not yet recorded, so a
    cut that no crash explains blocks from now on, here and after every reopen. A crash
    between a cut and its record leaves the manifest line, and the next open records it."""
    with core.writing():
        for record in unrecorded(core.log.quarantined(), core.state.cuts, core.log.cut_lines,
                                 _writes.now()):
            core.write(record, durable=True)


def resolve_automatically(core: Core) -> None:
    """On open: each interrupted execution of a registered tool asks the tool's reconcile hook,
    then its on_ambiguous policy. Each answer is a durable resolution with its actor."""
    for blocker in core.state.snapshot().blockers:
        tool = core.options.tools.get(blocker.tool or "")
        if tool is None or blocker.execution_id is None or blocker.state not in (
                rc.STATE_STARTED, rc.STATE_AMBIGUOUS):
            continue
        eid, name = blocker.execution_id, blocker.tool
        if tool.reconcile is not None:
            try:
                verdict = _reconcile_answer(tool.reconcile(blocker))
            except Exception as exc:  # the execution stays ambiguous; the failure is kept
                core.write(_writes.reconcile_failed(eid, name, exc), durable=False)
                continue
            if verdict is not None:
                write_resolution(core, eid, verdict, actor=f"reconcile:{name}",
                       note=f"the reconcile hook of {name!r} answered {verdict!r}")
                continue
        if tool.on_ambiguous == "assume_done":
            write_resolution(core, eid, "succeeded", actor="policy",
                   note=f"on_ambiguous='assume_done' for tool {name!r}")
        elif tool.on_ambiguous == "rerun":
            write_resolution(core, eid, "rerun", actor="policy",
                   note=f"on_ambiguous='rerun' for tool {name!r}: safe to dispatch again")


def _reconcile_answer(verdict: Any) -> str | None:
    """A reconcile hook's answer as the plain str that is recorded: "succeeded" or
    "not_performed" given as a str or as a str subclass whose text is exactly that (a
    str-valued Enum member), or None for unknown. Anything else, a subclass that only compares
    equal included, raises ValueError, which is recorded as a failed reconcile."""
    if verdict is None:
        return None
    if issubclass(type(verdict), str):
        text = str.__str__(verdict)  # its characters, whatever its __eq__ claims
        for answer in RECONCILE_ANSWERS:
            if answer is not None and text == answer:
                return answer
    try:
        shown = repr(verdict)[:200]
    except Exception:  # a broken __repr__: the type still says what came back
        shown = f"a {type(verdict).__name__}"
    raise ValueError(f"reconcile returned {shown}; expected 'succeeded', 'not_performed' "
                     "or None")
