"""What a power cut leaves of a file's unsynced writes and a directory's unsynced entries: the
crash model of tests/faultfs.py (its module docstring says what each mode loses)."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field

SECTOR = 512  # the unit a torn write loses whole when later writes outlive it (docs/FORMAT.md)


@dataclass
class Write:
    """One unsynced write: where, what it wrote, what it replaced, and its place in order."""

    start: int
    end: int
    data: bytes
    prior: bytes  # the bytes it overwrote (none past the file's end at the time)
    serial: int


@dataclass
class FileState:
    synced_size: int
    writes: list[Write] = field(default_factory=list)  # unsynced, in the order made
    cut: tuple[int, bytes] | None = None  # an unsynced truncation: (length, bytes it removed)


@dataclass
class DirState:
    synced_names: set[str] = field(default_factory=set)
    renames: list[tuple[str, str]] = field(default_factory=list)  # unsynced (src, dst) in order



def lose_file_bytes(path: str, state: FileState, mode: str, rng: random.Random) -> None:
    size = os.path.getsize(path)
    if state.cut is not None and size == state.cut[0]:
        with open(path, "ab") as f:  # the truncation never reached the disk
            f.write(state.cut[1])
        size += len(state.cut[1])
    synced = state.synced_size
    writes = state.writes
    if not writes:
        if size > synced:  # grown by no write this file system saw
            os.truncate(path, synced)
        return
    if mode == "drop":
        land(path, writes, [False] * len(writes), min(size, synced))
    elif mode == "tear":
        tear(path, writes, synced, size, rng)
    elif mode == "zero":
        start = rng.randint(min(w.start for w in writes), max(w.end for w in writes))
        with open(path, "r+b") as f:
            for w in writes:
                if w.end > start:
                    f.seek(max(w.start, start))
                    f.write(bytes(w.end - max(w.start, start)))
    else:  # reorder: each unsynced write reached the disk, or did not, on its own
        kept = [rng.random() < 0.5 for _ in writes]
        new_size = max([synced] + [w.end for w, k in zip(writes, kept, strict=True) if k])
        new_size = min(size, new_size)
        land(path, writes, kept, new_size)

def land(path: str, writes: list[Write], kept: list[bool], size: int) -> None:
    """The file as a power cut leaves it: every unsynced write undone (its bytes read back
    as what it overwrote, zeros where it grew the file), then those `kept` redone in order,
    and the file `size` long."""
    with open(path, "r+b") as f:
        for w in reversed(writes):
            f.seek(w.start)
            f.write(w.prior + bytes(w.end - w.start - len(w.prior)))
        for w, keep in zip(writes, kept, strict=True):
            if keep:
                f.seek(w.start)
                f.write(w.data)
    os.truncate(path, size)

def tear(path: str, writes: list[Write], synced: int, size: int,
          rng: random.Random) -> None:
    """Tear one unsynced write, any of them, at a random byte. Either the writes after it
    were lost and the file ends there (or at its durable size, if larger), or (half the
    time) the later writes landed as well: then what the torn write lost must be whole
    sectors, read back as zeros, since a disk writes a sector whole or not at all; a sector
    it shares with the next write is lost for both."""
    torn = rng.randrange(len(writes))
    w = writes[torn]
    point = rng.randint(w.start, w.end)
    if rng.random() < 0.5:
        first = min([synced] + [x.start for x in writes])  # bytes before it are durable
        hole_start = max(point - point % SECTOR, -(-first // SECTOR) * SECTOR)
        hole_end = min(-(-w.end // SECTOR) * SECTOR, size)
        if hole_start < hole_end and hole_start < w.end:
            with open(path, "r+b") as f:
                f.seek(hole_start)
                f.write(bytes(hole_end - hole_start))
            return
    kept = [i < torn for i in range(len(writes))]
    parts = [*writes[:torn], Write(w.start, point, w.data[:point - w.start], b"", 0)]
    end = max([synced] + [x.end for x in parts])
    land(path, writes, kept, end)
    if point > w.start:
        with open(path, "r+b") as f:
            f.seek(w.start)
            f.write(w.data[:point - w.start])

def lose_entries(directory: str, dstate: DirState, mode: str, rng: random.Random,
                  made: set[str]) -> None:
    def lost() -> bool:
        return mode != "reorder" or rng.random() < 0.5

    for src, dst in reversed(dstate.renames):
        if os.path.exists(dst) and lost():
            os.rename(dst, src)
    dstate.renames.clear()
    if not os.path.isdir(directory):
        return  # undone with its parent already
    for name in sorted(set(os.listdir(directory)) - dstate.synced_names):
        full = os.path.join(directory, name)
        if os.path.islink(full):
            continue
        if os.path.isfile(full) and lost():
            os.unlink(full)
        elif os.path.isdir(full) and full in made and lost():
            shutil.rmtree(full)  # an unsynced mkdir: the directory and all it held
