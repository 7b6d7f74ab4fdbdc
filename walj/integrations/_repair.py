"""Transcripts repaired from the journal: every tool call in a message history that has no
result gets the truthful one from the journal (docs/INTEGRATIONS.md, "Transcripts repaired from
the journal"). Framework-free: each integration's `repair_messages` reads its own shapes with
the functions it passes here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import walj

from ._shared import field, output_text

__all__ = ["Answer", "Call", "answer_for", "call_id_of", "repair_anthropic", "repair_separate"]

_INTERRUPTED = ("This call was interrupted before its result was recorded, and walj did not run "
                "it again")
_NOT_STORED_WHY = {
    "too_large": " (it was larger than the journal's max_stored_output_bytes)",
    "not_storable": " (it could not be stored as JSON)",
    "dropped_at_checkpoint": " (a checkpoint carried only the newest stored outputs)",
}


class Answer(NamedTuple):
    """The result a repair inserts for one call: its text, whether it reports a failure or a
    call that did not run (`is_error`), whether the call itself ran and failed (`failed`:
    its recorded error), and the journal's status it was made from."""

    text: str
    is_error: bool
    failed: bool
    status: walj.CallStatus


class Call(NamedTuple):
    """A tool call read from a message: its id, the tool's name, and which shape it came in
    (an integration's own tag, handed back to its result maker)."""

    call_id: str
    name: str | None
    shape: str


def _said(text: str | None) -> str:
    return f": {text}" if text else ""


def answer_for(status: walj.CallStatus) -> Answer:
    """The inserted result for a call the journal reports as `status`. Never an output the
    journal does not hold: a stored output (or a resolution's) as output_text gives it,
    otherwise a sentence saying what is known."""
    kind = status.status
    if kind == "settled" and status.outcome == "ok":
        if status.output_stored:
            return Answer(output_text(status.output), False, False, status)
        why = _NOT_STORED_WHY.get(status.output_not_stored or "", "")
        preview = (f" A redacted preview of it: {status.output_preview}"
                   if status.output_preview is not None else " No preview of it was recorded.")
        return Answer(f"This call completed (outcome ok), but the journal did not store its "
                      f"output{why}.{preview}", False, False, status)
    if kind == "settled":
        error = status.error or f"the call ended {status.outcome}"
        return Answer(error, True, True, status)
    if kind == "in_doubt":
        return Answer("The outcome of this call is unknown: it was interrupted before its "
                      "result was recorded, and walj did not run it again. A person must check "
                      "whether it took effect and settle it; until then, do not retry it.",
                      True, False, status)
    if kind == "resolved":
        return _resolved(status)
    if kind == "not_run":
        return Answer("This call was not run, so it has no result.", True, False, status)
    approval = _approval_text(status)
    if approval is not None:
        return Answer(approval, True, False, status)
    if status.reason == "log_damage":
        return Answer("The outcome of this call cannot be told: part of the journal's log was "
                      "damaged, and walj did not run it again.", True, False, status)
    return Answer("The outcome of this call cannot be told: the journal no longer indexes its "
                  "call id (it may have been settled before the journal's replay window), and "
                  "walj did not run it again.", True, False, status)


def _resolved(status: walj.CallStatus) -> Answer:
    outcome = status.outcome or "an unrecorded outcome"
    if outcome == "succeeded" and status.output is not None:
        return Answer(output_text(status.output), False, False, status)
    actor = status.actor or "an unrecorded actor"
    text = f"{_INTERRUPTED}; {actor} resolved it as {outcome}{_said(status.note)}."
    return Answer(text, outcome != "succeeded", outcome == "failed", status)


def _approval_text(status: walj.CallStatus) -> str | None:
    """The text for a call that needs a person's approval and has not run; None otherwise."""
    approval, actor = status.approval_id, status.actor or "an unrecorded actor"
    return {
        "awaiting_approval": f"This call was not run: it awaits a person's approval "
                             f"({approval}).",
        "approved": f"This call was not run yet: {actor} approved it ({approval}), and it was "
                    "not dispatched since.",
        "denied": f"This call was not run: {actor} denied it ({approval}){_said(status.note)}.",
        "approval_expired": f"This call was not run: its approval ({approval}) expired before "
                            "it ran.",
    }.get(status.status)


def _statuses(journal: walj.ToolJournal) -> Callable[[str], Answer]:
    """Answers from `journal`, each call id asked once per repair."""
    if not isinstance(journal, walj.ToolJournal):
        raise TypeError(f"journal must be a walj.ToolJournal, not {type(journal).__name__}")
    known: dict[str, Answer] = {}

    def answer(call_id: str) -> Answer:
        found = known.get(call_id)
        if found is None:
            found = known[call_id] = answer_for(journal.call_status(call_id))
        return found

    return answer


def _listed(messages: Any) -> list[Any]:
    if isinstance(messages, (str, bytes, bytearray, Mapping)) or not isinstance(messages,
                                                                                Iterable):
        raise TypeError("messages must be a list of messages, not "
                        f"{type(messages).__name__}")
    return list(messages)


def call_id_of(value: Any, key: str, what: str, index: int) -> str:
    """A tool call's id; ValueError when it has none (no result could name it)."""
    call_id = field(value, key)
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{what} in message {index} has no {key}: {value!r:.200}")
    return call_id


def repair_separate(messages: Any, journal: walj.ToolJournal,
                    calls_of: Callable[[Any, int], Sequence[Call]],
                    result_of: Callable[[Any], str | None],
                    make: Callable[[Call, Answer], Any]) -> list[Any]:
    """A history whose results are messages of their own, each naming its call's id (OpenAI
    Chat tool messages, Responses function_call_output items, LangChain ToolMessages): a new
    list where each call no result names is answered by `make`, right after its message and
    the results that follow it, in call order. Every other message is kept as it is."""
    items = _listed(messages)
    answer = _statuses(journal)
    answered = {found for item in items if (found := result_of(item)) is not None}
    repaired: list[Any] = []
    waiting: list[Call] = []
    for index, item in enumerate(items):
        if waiting and result_of(item) is None:
            repaired += [make(call, answer(call.call_id)) for call in waiting]
            waiting = []
        repaired.append(item)
        waiting += [call for call in calls_of(item, index) if call.call_id not in answered]
    repaired += [make(call, answer(call.call_id)) for call in waiting]
    return repaired


def _blocks(message: Any) -> list[Any] | None:
    content = field(message, "content")
    if isinstance(content, Sequence) and not isinstance(content, (str, bytes, bytearray)):
        return list(content)
    return None


def _tool_result(call_id: str, found: Answer) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": found.text,
            "is_error": found.is_error}


def repair_anthropic(messages: Any, journal: walj.ToolJournal) -> list[Any]:
    """An Anthropic Messages history: each assistant message's tool_use blocks are answered in
    the next message, a user message whose tool_result blocks come first. A missing result is
    added to that user message (a copy: its tool_result blocks, the new ones, then its other
    blocks), or, when the next message is not a user message, in a new user message after
    the assistant's. A message with all its results is kept as it is."""
    items = _listed(messages)
    answer = _statuses(journal)
    repaired: list[Any] = []
    skip = False
    for index, item in enumerate(items):
        if skip:
            skip = False
            continue
        repaired.append(item)
        if field(item, "role") != "assistant":
            continue
        uses = [call_id_of(block, "id", "a tool_use block", index)
                for block in _blocks(item) or () if field(block, "type") == "tool_use"]
        after = items[index + 1] if index + 1 < len(items) else None
        # A user message is added to only when its content is text or blocks: any other
        # content would not survive the copy.
        reply = after if field(after, "role") == "user" and (
            _blocks(after) is not None or isinstance(field(after, "content"), str)) else None
        answered = {found for block in _blocks(reply) or ()
                    if field(block, "type") == "tool_result"
                    and isinstance(found := field(block, "tool_use_id"), str)}
        missing = [_tool_result(call_id, answer(call_id))
                   for call_id in dict.fromkeys(uses) if call_id not in answered]
        if missing:
            repaired.append(_with_results(reply, missing))
            skip = reply is not None
    return repaired


def _with_results(reply: Any, missing: list[dict[str, Any]]) -> dict[str, Any]:
    """The user message after an assistant's tool_use blocks, with `missing` results added."""
    if reply is None:
        return {"role": "user", "content": missing}
    blocks = _blocks(reply)
    if blocks is None:
        text = field(reply, "content")
        blocks = [{"type": "text", "text": text}] if isinstance(text, str) and text else []
    results = [block for block in blocks if field(block, "type") == "tool_result"]
    others = [block for block in blocks if field(block, "type") != "tool_result"]
    message = dict(reply) if isinstance(reply, Mapping) else {"role": "user"}
    message["content"] = [*results, *missing, *others]
    return message
