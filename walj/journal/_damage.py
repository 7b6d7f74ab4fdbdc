"""What recovery cut from the log, and whether a crash explains it: the journal's account of
damage, so that bytes cut on open never silently unblock dispatch. Standard library only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import CorruptionError
from . import _records as r
from ._records import Blocker, Cut, Resolution, record_kind

if TYPE_CHECKING:  # the log's types only: rebuilding state needs no file code
    from ..log import CutLine, Quarantined

# The journal's records that it writes without waiting for a sync. Every other record (an
# intent, a terminal record, a resolution, a log_cut) is durable before anything follows it.
UNSYNCED_KINDS = frozenset({r.TURN_STARTED, r.TURN_COMPLETED, r.BLOCKED, r.LLM_STARTED,
                            r.LLM_FINISHED, r.RECONCILE_FAILED})
REVIEWED = "reviewed"


def unexplained(entry: Quarantined, lines: list[CutLine], intact: bool) -> str | None:
    """Why no crash explains this cut, or None when one does.

    A crash explains a cut when nothing in it can have been acknowledged. The journal writes one
    record at a time and waits for the sync of every durable one before it writes the next, and
    a sync covers every byte written before it. So a durable record with anything after it was
    acknowledged, and so was every byte before it: zeros or a bad line there are damage to synced
    data. A durable record that is the last thing cut may have died in its own sync.
    """
    if not intact:
        return ("the quarantine file no longer holds the bytes its manifest line says were cut, "
                "so what they held cannot be checked")
    if not entry.torn_kind:
        return (f"cut at {entry.kind}, which no crash leaves (a repair of damage): the cut bytes "
                "may hold acknowledged records")
    for line in lines:
        if line.end < entry.length and record_kind(line.data) not in UNSYNCED_KINDS:
            kind = record_kind(line.data) or "a record of no journal kind"
            return (f"record {line.seq} ({kind}) among the cut bytes was written durably and "
                    "more followed it, so it and everything before it had been synced: this is "
                    "damage, not a crash")
    return None


def cut_record(entry: Quarantined, lines: list[CutLine], intact: bool, at: float) -> dict[str, Any]:
    """The journal's durable account of one cut: a log_cut record."""
    reason = unexplained(entry, lines, intact)
    return {"kind": r.LOG_CUT, "version": r.CONTRACT_VERSION, "quarantine_file": entry.file,
            "at": at, "segment": entry.segment, "offset": entry.offset, "length": entry.length,
            "cut_kind": entry.kind, "records": len(lines),
            "seqs": [lines[0].seq, lines[-1].seq] if lines else None,
            "explained": reason is None, "reason": reason}


def unrecorded(entries: Iterable[Quarantined], ledger: CutLedger,
               lines_of: Callable[[Quarantined], tuple[list[CutLine], bool]],
               at: float) -> list[dict[str, Any]]:
    """The log_cut records still to write: one for each cut the journal has not recorded."""
    records = []
    for entry in entries:
        if entry.file not in ledger.cuts:
            lines, intact = lines_of(entry)
            records.append(cut_record(entry, lines, intact, at))
    return records


class CutLedger:
    """The cuts a journal has recorded, fed from its log_cut and log_cut_resolved records; the
    unexplained ones not yet resolved block."""

    def __init__(self, resolutions: list[Resolution]) -> None:
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

