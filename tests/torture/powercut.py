"""In-process lives of a log over the fault-injecting file system, with an oracle of what was
acknowledged as durable, and the check that a reopen on the real file system recovers it."""

from __future__ import annotations

import errno
import gc
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from budget import TALLY
from faultfs import CRASH_MODES, FaultyFS, SimulatedCrash, abandon
from spec_reader import SpecError, read_records

import walj
from walj.log import lock

POWER_CUTS = tuple(m for m in CRASH_MODES if m != "keep")
FAIL_OPS = ("write", "sync", "rename", "sync_dir", "create")
# Met only when a tail is cut (truncate also when a seal or close trims the active segment).
RECOVERY_OPS = ("truncate", "unlink", "open_append", "mkdir")


def forget_locks_of_dead_process(path: Path) -> None:
    """A crash inside Log.open leaves no handle to abandon; a dead process holds no lock."""
    gc.collect()  # the unreachable FileLock lets go of its descriptor
    if path.exists():
        st = path.stat()
        with lock._open_dirs_guard:
            lock._open_dirs.pop((st.st_dev, st.st_ino), None)


def make_record(life: int, k: int, rng: random.Random) -> dict[str, Any]:
    pad = "x" * rng.choice([0, 5, 30, 120, 400, 2500])
    return {"l": life, "k": k, "pad": pad, "h": zlib.crc32(f"{life}:{k}:{pad}".encode())}


@dataclass
class Oracle:
    """What the workload was told: `written` appends returned, `durable` ones were promised to
    survive a power cut (returned in "always"/"batch", or covered by a returned sync)."""

    written: dict[int, tuple[int, int]] = field(default_factory=dict)
    durable: set[int] = field(default_factory=set)

    def check(self, path: Path, context: str) -> int:
        """Reopen on the real file system; every durable record is there, intact, in order.
        Forget non-durable records past the recovered end (their seqs will be reused).

        Before the reopen, the reader written from docs/FORMAT.md alone reads what the crash
        left; it must end exactly where walj's recovery cuts, and read what walj.read reads."""
        try:  # the crashed directory, before walj's recovery has touched it
            spec = read_records(path) if path.exists() else []
        except SpecError as exc:
            raise AssertionError(f"{context}: the FORMAT.md reader refused the crashed log "
                                 f"walj is about to recover: {exc}") from exc
        try:
            with walj.Log.open(path) as log:
                held = log.last_seq
        except walj.WaljError as exc:
            raise AssertionError(f"{context}: reopen failed: {exc!r}") from exc
        records = list(walj.read(path))
        assert spec == [(r.seq, r.data) for r in records] == read_records(path), (
            f"{context}: the FORMAT.md reader read {len(spec)} records from the crashed log, "
            f"walj.read {len(records)} after recovery")
        assert [r.seq for r in records] == list(range(1, held + 1)), context
        lost = [s for s in self.durable if s > held
                or (records[s - 1].data["l"], records[s - 1].data["k"]) != self.written[s]]
        TALLY.add(checked=len(self.durable) - len(lost), lost=len(lost))
        assert not lost, f"{context}: durable records lost at seqs {sorted(lost)[:10]}"
        for record in records:
            d = record.data
            assert d["h"] == zlib.crc32(f"{d['l']}:{d['k']}:{d['pad']}".encode()), context
            if record.seq in self.written:
                assert (d["l"], d["k"]) == self.written[record.seq], f"{context}: {record.seq}"
        self.written = {s: v for s, v in self.written.items() if s <= held}
        report = walj.verify(path)
        assert report.ok and report.torn_tail is None, f"{context}: {report.problems}"
        return held


@dataclass
class Plan:
    """The fault of one life: a crash point, or a failing call, or a short write, or none."""

    kind: str  # "crash", "fail", "short", "short then fail", "none"
    op: str = "any"
    nth: int = 1
    after: bool = False
    err: int = errno.EIO
    power_cut: str | None = None  # what a power cut at the end of the life loses
    injected: list[str] = field(default_factory=list)  # what the life's file system injected

    def arm(self, fs: FaultyFS) -> None:
        if self.kind == "crash":
            fs.crash_at(self.op, self.nth, after=self.after)
        elif self.kind == "fail":
            fs.fail(self.op, self.nth, self.err)

    def describe(self) -> str:
        if self.kind == "crash":
            return f"crash at call {self.nth} {'after' if self.after else 'before'} its work"
        if self.kind == "fail":
            return f"{errno.errorcode[self.err]} on {self.op} #{self.nth}"
        if self.kind == "short then fail":
            return f"short write, then {errno.errorcode[self.err]}, at step {self.nth}"
        return self.kind


def random_plan(rng: random.Random) -> Plan:
    kind = rng.choice(["crash", "crash", "fail", "fail", "short", "short then fail", "none"])
    cut = rng.choice(POWER_CUTS) if kind == "crash" or rng.random() < 0.5 else None
    if kind == "crash":
        return Plan("crash", "any", rng.randint(1, 120), rng.random() < 0.5, power_cut=cut)
    err = rng.choice([errno.EIO, errno.ENOSPC])
    if kind == "fail":
        op = rng.choice(FAIL_OPS + RECOVERY_OPS)
        nth = rng.randint(1, 40 if op in ("write", "sync") else 3)
        return Plan("fail", op, nth, err=err, power_cut=cut)
    return Plan(kind, nth=rng.randint(0, 30), err=err, power_cut=cut)


def run_life(path: Path, oracle: Oracle, life: int, rng: random.Random, sync: str,
             plan: Plan, segment_bytes: int = 1024, ops: int = 40) -> str:
    """One process life: open, work, meet the planned fault. Returns what happened."""
    fs = FaultyFS(freeze_on_crash=True)
    plan.arm(fs)
    log: walj.Log | None = None
    outcome = "clean"
    k = 0
    faults_at_open: int | None = None  # faults that fired before open returned
    try:
        log = walj.Log.open(path, sync=sync, segment_bytes=segment_bytes,
                            max_record_bytes=8192, sync_interval_ms=rng.choice([1, 10]), _fs=fs)
        faults_at_open = len(fs.injected)
        for step in range(ops):
            if plan.kind.startswith("short") and step == plan.nth:
                fs.short_write_bytes = rng.randint(1, 60)
                if plan.kind == "short then fail":  # the write after the short one fails
                    fs.fail("write", 2, plan.err)
            op = rng.random()
            if op < 0.6:
                durable = rng.random() < 0.1
                seq = log.append(make_record(life, k, rng), durable=durable)
                oracle.written[seq] = (life, k)
                if durable or sync in ("always", "batch"):
                    oracle.durable.add(seq)
                k += 1
            elif op < 0.85:
                batch = [make_record(life, k + i, rng) for i in range(rng.randint(1, 5))]
                durable = rng.random() < 0.2
                seqs = log.append_many(batch, durable=durable)
                for i, seq in enumerate(seqs):
                    oracle.written[seq] = (life, k + i)
                    if durable or sync in ("always", "batch"):
                        oracle.durable.add(seq)
                k += len(batch)
            else:
                log.sync()
                oracle.durable.update(oracle.written)
        log.close()
        oracle.durable.update(oracle.written)
    except SimulatedCrash:
        outcome = "crash"
    except walj.PoisonedError as exc:
        if log is None:  # open failed, typed, with nothing acknowledged yet
            outcome = "open failed"
            plan.injected = list(fs.injected)
            TALLY.add(faults=len(fs.injected))
            forget_locks_of_dead_process(path)
            return outcome
        outcome = "poisoned"
        if plan.kind == "fail" and plan.err == errno.ENOSPC and not fs.dead:
            assert isinstance(exc, walj.DiskFullError), f"ENOSPC gave {exc!r}"
        for call in (lambda: log.append({"x": 1}), log.sync,
                     lambda: log.append_many([{"x": 1}])):
            try:
                call()
            except (walj.PoisonedError, walj.ClosedError):  # ClosedError: close() failed
                pass
            else:
                raise AssertionError(f"a poisoned log accepted more work after {plan.describe()}")
        closed_before = log.closed  # close() itself may have been what raised
        try:
            log.close()  # releases the lock; the poisoned handle does not sync
        except walj.PoisonedError:
            pass
        else:
            assert closed_before, f"close() of a poisoned log did not raise ({plan.describe()})"
    except OSError as exc:
        # Every I/O failure is typed, from open too: a raw OSError is a bug.
        raise AssertionError(f"raw OSError out of walj after {plan.describe()}: {exc!r}") from exc
    if (plan.kind in ("fail", "short then fail") and faults_at_open is not None
            and len(fs.injected) > faults_at_open):
        # A failed write, sync, rename or directory sync on an open log must poison it.
        assert outcome == "poisoned", f"{plan.describe()} fired, yet the log went on: {outcome}"
    if outcome == "crash" or plan.power_cut is not None:
        fs.crash(plan.power_cut or "drop", rng)
        if log is not None:
            abandon(log)
        else:
            forget_locks_of_dead_process(path)
    plan.injected = list(fs.injected)
    TALLY.add(faults=len(fs.injected))
    return outcome
