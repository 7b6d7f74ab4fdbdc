"""The retention torture family's trees: a seeded generator of session trees under a ROOT, made
with the real walj API in child processes, and the children that run retention steps on them.

A tree holds, at random: ended, idle (active, never ended) and blocked sessions (a SIGKILL inside
a tool leaves an ambiguous call); sessions nested inside another session's directory; sessions
held open by a live writer (a child that keeps the writer lock until the trial ends); torn tails
moved to `quarantine/` by the next open; forked copies (`cp -r` of an idle session, then both
go on and diverge); hard-linked copies of an ended session; a symlink to a session in ROOT and
one to a session outside ROOT; unknown files in a session and in ROOT.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sigkill import _start  # the SIGKILL family's way to start a child (fork server or not)

SEGMENT_NAME_PREFIX = "seg-"



class Child:
    """A child process of the torture suite (forked from the fork server where possible), its
    oracle lines as they come, and a way to signal it."""

    def __init__(self, script: str, args: list[str]) -> None:
        read_fd, write_fd = os.pipe()
        try:
            self._child, self._err_fd = _start(script, args, None, write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self._read_fd = read_fd
        self._buffer = b""
        self.lines: list[str] = []
        self.signals: list[signal.Signals] = []
        self.returncode: int | None = None
        self.stderr = ""

    def _pump(self, timeout: float) -> bool:
        """Read what the child said within `timeout`; False at end of file."""
        if not select.select([self._read_fd], [], [], max(0.0, timeout))[0]:
            return True
        data = os.read(self._read_fd, 65536)
        if not data:
            return False
        self._buffer += data
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines += [line.decode() for line in complete]
        return True

    def wait_for(self, prefix: str, timeout: float = 60) -> str | None:
        """The first oracle line starting with `prefix`, once said; None if the child ended
        (or `timeout` passed) first."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            left = deadline - time.monotonic()
            if left <= 0 or not self._pump(min(left, 1.0)):
                return next((line for line in self.lines if line.startswith(prefix)), None)

    def send(self, sig: signal.Signals) -> None:
        if self._child.poll() is not None:
            return
        self.signals.append(sig)
        if isinstance(self._child, subprocess.Popen):
            self._child.send_signal(sig)
        else:  # forked by the fork server: signalled through its pidfd, no pid race
            signal.pidfd_send_signal(self._child._pidfd, sig)

    def finish(self, timeout: float = 120) -> int:
        """Wait for the child (SIGKILL after `timeout`), read the rest of what it said."""
        deadline = time.monotonic() + timeout
        while self._child.poll() is None and time.monotonic() < deadline:
            self._pump(0.05)
        if self._child.poll() is None:
            self.send(signal.SIGKILL)
        self.returncode = self._child.wait()
        while self._pump(0):
            pass
        with os.fdopen(self._err_fd, "rb") as err:
            self.stderr = err.read().decode(errors="replace")
        os.close(self._read_fd)
        return self.returncode


@dataclass
class Tree:
    """A generated tree: where everything is, and what the judge must know about it."""

    root: Path
    outside: Path
    kinds: dict[Path, str] = field(default_factory=dict)  # session -> ended, idle, blocked
    forks: list[Path] = field(default_factory=list)  # `cp -r` copies that diverged
    held: dict[Path, Child] = field(default_factory=dict)  # session -> its live writer
    unknown: list[Path] = field(default_factory=list)  # files walj knows nothing of
    linked: list[Path] = field(default_factory=list)  # sessions sharing segment inodes
    quarantined: list[Path] = field(default_factory=list)  # sessions with a quarantine/

    def describe(self) -> str:
        """The tree in one line, for a failure's message."""
        parts = []
        for path, kind in sorted(self.kinds.items()):
            marks = [kind] + [mark for mark, paths in (
                ("held open", self.held), ("a fork", self.forks), ("hard links", self.linked),
                ("quarantine", self.quarantined)) if path in paths]
            parts.append(f"{self._name(path)} {'+'.join(marks)}")
        for link in sorted(p for p in self.root.iterdir() if p.is_symlink()):
            parts.append(f"{link.name} -> {os.readlink(link)}")
        parts += [f"unknown file {self._name(p)}" for p in self.unknown]
        return "tree: " + ", ".join(parts)

    def _name(self, path: Path) -> str:
        for top, label in ((self.root, ""), (self.outside, "OUTSIDE/")):
            if top in path.parents:
                return label + str(path.relative_to(top))
        return str(path)

    def release(self) -> None:
        """End every live writer (SIGKILL: a writer that dies holding the lock)."""
        for child in self.held.values():
            child.send(signal.SIGKILL)
            child.finish()


def make_session(path: Path, kind: str, turns: int, segment_bytes: int, seed: str,
             quarantine: bool = False) -> None:
    """Make (or go on with) a session in a child; a blocked one is killed inside its tool."""
    child = Child("child_retention_session.py",
                  [str(path), kind, str(turns), str(segment_bytes), seed, str(int(quarantine))])
    if kind == "blocked":
        assert child.wait_for("T ") is not None, f"{path}: never reached its tool"
        child.send(signal.SIGKILL)
    code = child.finish()
    assert code == (-signal.SIGKILL if kind == "blocked" else 0), \
        f"{path}: the session child failed ({code}):\n{child.stderr}"


def hold_open(path: Path, seed: str) -> Child:
    child = Child("child_retention_session.py", [str(path), "hold", "0", "1024", seed, "0"])
    assert child.wait_for("O") is not None, f"{path}: the live writer never opened:\n" \
        f"{child.finish()} {child.stderr}"
    return child


def _hard_linked_copy(source: Path, copy: Path) -> None:
    """`cp -al` of a session, but for its lock files: its segments are the same inodes."""
    copy.mkdir()
    for entry in sorted(source.iterdir()):
        if entry.name.startswith(SEGMENT_NAME_PREFIX):
            os.link(entry, copy / entry.name)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, copy / entry.name, symlinks=True)


def _unknown_file(tree: Tree, where: Path, rng: random.Random) -> None:
    name = rng.choice(["notes.txt", "export.csv", ".DS_Store", "core.1234"])
    path = where / name
    path.write_bytes(f"{where.name}: {rng.randrange(10**9)}\n".encode() * rng.randint(1, 40))
    tree.unknown.append(path)


def build_tree(rng: random.Random, base: Path, seed: str) -> Tree:
    """A random tree of sessions under base/root, with a few outside it (base/outside)."""
    tree = Tree(base / "root", base / "outside")
    tree.root.mkdir(parents=True)
    tree.outside.mkdir()
    tops = [tree.root / f"user{i}" for i in range(rng.randint(3, 5))]

    def make(path: Path, kind: str, *, quarantine: bool = False) -> None:
        make_session(path, kind, rng.randint(2, 8), rng.choice([1024, 2048]), seed, quarantine)
        tree.kinds[path] = kind
        if quarantine:
            tree.quarantined.append(path)

    for path in tops:
        make(path, rng.choice(["ended", "ended", "idle", "blocked"]),
             quarantine=rng.random() < 0.35)
    # A session inside another one's directory, often blocked and held by a live writer.
    for parent in rng.sample(tops, rng.randint(0, 2)):
        if tree.kinds[parent] == "blocked" or rng.random() < 0.3:
            continue
        nested = parent / f"thread{rng.randint(1, 9)}"
        make(nested, rng.choice(["blocked", "blocked", "idle", "ended"]))
        if rng.random() < 0.6:
            tree.held[nested] = hold_open(nested, seed)
    # A forked copy: `cp -r` of an idle session, then both go on and differ.
    idle = [p for p in tops if tree.kinds[p] == "idle"]
    if idle and rng.random() < 0.8:
        source = rng.choice(idle)
        fork = source.with_name(source.name + "-copy")
        shutil.copytree(source, fork, symlinks=True)
        tree.forks.append(fork)
        tree.kinds[fork] = "idle"
        for path in (source, fork):
            make(path, rng.choice(["idle", "ended"]))
    # A hard-linked copy of an ended session.
    ended = [p for p in tops if tree.kinds[p] == "ended"]
    if ended and rng.random() < 0.4:
        source = rng.choice(ended)
        copy = source.with_name(source.name + "-links")
        _hard_linked_copy(source, copy)
        tree.kinds[copy] = "ended"
        tree.linked += [source, copy]
    # Symlinks: to a session in ROOT, and to one outside it. Neither is ever followed.
    if rng.random() < 0.5:
        os.symlink(rng.choice(tops).name, tree.root / "alias")
    if rng.random() < 0.5:
        make(tree.outside / "elsewhere", rng.choice(["ended", "idle"]))
        os.symlink(tree.outside / "elsewhere", tree.root / "elsewhere")
    # A held top session (a live writer on an ended or idle one).
    # (Not one with hard-linked segments: a writer refuses those, as it should.)
    free = [p for p in tops if p not in tree.held and p not in tree.linked
            and tree.kinds[p] != "blocked"]
    if free and rng.random() < 0.3:
        held = rng.choice(free)
        tree.held[held] = hold_open(held, seed)
    for _ in range(rng.randint(0, 2)):
        _unknown_file(tree, rng.choice([tree.root, *tops]), rng)
    return tree
