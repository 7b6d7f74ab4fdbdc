"""What recovery cut from the log, and whether a crash explains it: the journal's account of
damage, so that bytes cut on open never silently unblock dispatch. Standard library only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import CorruptionError
from . import records as r
from ._records import Blocker, Cut, Resolution
from .records import decode_record, record_kind, show

if TYPE_CHECKING:  # the log's types only: rebuilding state needs no file code
    from ..log import CutLine, Quarantined

# The journal's records that it writes without waiting for a sync. Every other record (an
# intent, a terminal record, a resolution, a log_cut) is durable before anything follows it.
UNSYNCED_KINDS = frozenset({r.TURN_STARTED, r.TURN_COMPLETED, r.BLOCKED, r.LLM_STARTED,
                            r.LLM_FINISHED, r.RECONCILE_FAILED})
# Records about an execution that the journal writes only once its intent is durable.
_AFTER_INTENT = frozenset({r.FINISHED, r.AMBIGUOUS, r.RESOLVED, r.RECONCILE_FAILED})
REVIEWED = "reviewed"


class Before(Protocol):
    """What the records left in the log say about the bytes before a cut: the rebuilt state."""

    @property
    def last_seq(self) -> int: ...  # the last record left in the log

    @property
    def executions(self) -> Mapping[str, Any]: ...  # open executions, by id


def unexplained(entry: Quarantined, lines: list[CutLine], intact: bool,
                before: Before) -> str | None:
    """Why no crash explains this cut, or None when one does.

    A crash explains a cut only when no record among the cut bytes, and no record the cut bytes
    destroyed, can have been acknowledged, for a crash loses only what no sync has covered yet.
    What survives is the proof (docs/RECOVERY.md, "Damage that recovery cuts"):

    - a record written once the log had synced through seq N (its `synced_through`) proves
      that every record up to N was synced: the cut must begin after N;
    - the journal writes one record at a time and syncs every durable one before it writes the
      next, so a durable record with anything after it was acknowledged, and so was every byte
      before it;
    - a terminal record (or another record about an execution) proves that its intent was
      durable: its intent must still be in the log or among the cut bytes.

    A record that no later one vouches for (the last durable record cut, say) may have died in
    its own sync, and records the journal writes without a sync may be lost to a power cut.
    """
    if not intact:
        return ("the quarantine file no longer holds the bytes its manifest line says were cut, "
                "so what they held cannot be checked")
    if not entry.torn_kind:
        return (f"cut at {entry.kind}, which no crash leaves (a repair of damage): the cut bytes "
                "may hold acknowledged records")
    # The seq of the first record the cut bytes held, whole or destroyed: the one after the
    # last record left in the log (or the first that survives in the cut, if lower).
    first = min([before.last_seq + 1] + [line.seq for line in lines[:1]])
    intents: set[str] = set()
    for line in lines:
        kind = record_kind(line.data) or "a record of no journal kind"
        record = _decoded(line.data)
        reason = (_orphan(line.seq, kind, record, intents, before)
                  or _followed(line, kind, entry.length)
                  or _covered(line.seq, kind, record, first))
        if reason is not None:
            return reason
        if kind == r.STARTED and isinstance(record.get("execution_id"), str):
            intents.add(record["execution_id"])
    return None


def _decoded(data: bytes) -> dict[str, Any]:
    """A cut record's fields, or none when it is not a JSON object (its kind still counts)."""
    try:
        record = decode_record(data)
    except (ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _orphan(seq: int, kind: str, record: Mapping[str, Any], intents: set[str],
            before: Before) -> str | None:
    """A record about an execution whose intent is gone: the cut destroyed a durable intent."""
    if kind not in _AFTER_INTENT:
        return None
    execution_id = record.get("execution_id")
    if isinstance(execution_id, str) and (execution_id in intents
                                          or execution_id in before.executions):
        return None
    return (f"record {seq} ({kind}) among the cut bytes is about execution "
            f"{show(execution_id)}, whose intent was durable before it was written and is "
            "neither in the log nor among the cut bytes: the cut destroyed an acknowledged "
            "intent, which is damage, not a crash")


def _followed(line: CutLine, kind: str, length: int) -> str | None:
    """A durable record with anything after it: it, and every byte before it, was synced."""
    if line.end < length and kind not in UNSYNCED_KINDS:
        return (f"record {line.seq} ({kind}) among the cut bytes was written durably and more "
                "followed it, so it and everything before it had been synced: this is damage, "
                "not a crash")
    return None


def _covered(seq: int, kind: str, record: Mapping[str, Any], first: int) -> str | None:
    """A record written after the log had synced records the cut holds."""
    if r.SYNCED_THROUGH not in record:
        return None
    synced = record[r.SYNCED_THROUGH]
    if type(synced) is not int or synced < 0:
        return (f"record {seq} ({kind}) among the cut bytes has {r.SYNCED_THROUGH} "
                f"{show(synced)}, not a seq: what it vouches for cannot be read")
    if synced < first:
        return None
    return (f"record {seq} ({kind}) among the cut bytes was written once the log had synced "
            f"every record through seq {synced}, and the cut holds records from seq {first}: "
            "synced records were cut, which is damage, not a crash")


def cut_record(entry: Quarantined, lines: list[CutLine], intact: bool, at: float,
               before: Before) -> dict[str, Any]:
    """The journal's durable account of one cut: a log_cut record."""
    reason = unexplained(entry, lines, intact, before)
    return r.new_record(r.LOG_CUT, quarantine_file=entry.file, at=at, segment=entry.segment,
                        offset=entry.offset, length=entry.length, cut_kind=entry.kind,
                        records=len(lines),
                        seqs=[lines[0].seq, lines[-1].seq] if lines else None,
                        explained=reason is None, reason=reason)


def unrecorded(entries: Iterable[Quarantined], ledger: CutLedger,
               lines_of: Callable[[Quarantined], tuple[list[CutLine], bool]],
               at: float) -> list[dict[str, Any]]:
    """The log_cut records still to write: one for each cut the journal has not recorded,
    judged against the state the ledger's records were rebuilt into."""
    records = []
    for entry in entries:
        if entry.file not in ledger.cuts:
            lines, intact = lines_of(entry)
            records.append(cut_record(entry, lines, intact, at, ledger.before))
    return records


class CutLedger:
    """The cuts a journal has recorded, fed from its log_cut and log_cut_resolved records; the
    unexplained ones not yet resolved block."""

    def __init__(self, resolutions: list[Resolution], before: Before) -> None:
        self.before = before  # the state being rebuilt: what the log holds before a new cut
        self.cuts: dict[str, Cut] = {}
        self.damage: dict[str, Cut] = {}  # unexplained and unresolved: each one blocks
        self._resolutions = resolutions

    def log_cut(self, seq: int, record: Mapping[str, Any]) -> None:
        name = record.get("quarantine_file")
        segment, kind, why = record.get("segment"), record.get("cut_kind"), record.get("reason")
        offset, length, count = record.get("offset"), record.get("length"), record.get("records")
        explained = record.get("explained")
        if not (isinstance(name, str) and name and isinstance(segment, str)
                and isinstance(kind, str) and type(offset) is int and type(length) is int
                and type(count) is int and type(explained) is bool
                and (why is None or isinstance(why, str))):
            # Fail closed: an account of damage that cannot be read must not read as none.
            raise CorruptionError(f"journal record {seq} (log_cut) cannot be read", seq=seq,
                                  kind="journal_record")
        if name in self.cuts:
            return  # recorded once; a second account changes nothing
        cut = Cut(name, segment, offset, length, kind, count, explained, why, seq)
        self.cuts[name] = cut
        if not explained:
            self.damage[name] = cut

    def resolved(self, seq: int, record: Mapping[str, Any], outcome: str, actor: str,
                 note: str | None, at: float | None) -> None:
        name = record.get("quarantine_file")
        cut = self.damage.pop(name, None) if isinstance(name, str) else None
        if cut is None:
            return
        self.cuts[cut.quarantine_file] = replace(cut, resolved=True)
        self._resolutions.append(Resolution("log_cut", cut.quarantine_file, None, None, outcome,
                                            actor, note, at, seq))

    def blockers(self) -> list[Blocker]:
        return [Blocker(cut.quarantine_file, None, None, r.STATE_LOG_DAMAGE, None, None,
                        cut.reason, seq=cut.seq, quarantine_file=cut.quarantine_file)
                for cut in self.damage.values()]

