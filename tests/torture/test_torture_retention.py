"""Retention and archival under SIGKILL and SIGINT: random trees of sessions (nested, forked,
hard-linked, symlinked, quarantined, blocked, ended, idle, held open by a live writer, beside
unknown files), random `walj prune --archive`, `walj archive` and `ToolJournal.compact(archive=)`
runs against a file:// archive and moto's S3 server, two prunes at once, signals at random
moments. After every step: every acknowledged record and every quarantined or unknown byte is
on disk or in a verified archive object, every archived session verifies, every blocker still
blocks, nothing held by a live process (or outside ROOT) was touched; at the end a last prune
finishes what was interrupted, leaving no tombstone, and the same holds."""

from __future__ import annotations

import json
import random
import shutil
import signal
from pathlib import Path

import pytest
from budget import SEED, TALLY, TRIALS, rng_for
from retention import Child, Tree, build_tree, hold_open, make_session
from retention_judge import Store, Truth, look

import walj
import walj.archive

FILE_TRIALS = max(3, TRIALS // 50)  # 4 at the default budget
S3_TRIALS = max(1, TRIALS // 200)  # 1
STEPS = 3  # random steps per tree, then the last prune


def _signal(rng: random.Random) -> signal.Signals | None:
    return rng.choice([None, None, signal.SIGKILL, signal.SIGINT])


def _run(step: str, args: list[str], env: dict[str, str], out: Path, rng: random.Random,
         sig: signal.Signals | None, context: str) -> str:
    """Run one step in a child, signalled at a random moment if asked; what it did, in short."""
    child = Child("child_retention_run.py", [json.dumps(env), str(out), step, *args])
    return _finish(child, out, rng, sig, context)


def _finish(child: Child, out: Path, rng: random.Random, sig: signal.Signals | None,
            context: str) -> str:
    """Signal a started step at a random moment of its work (if it has not returned by then),
    wait for it, and fail on a crash: a traceback that is not the KeyboardInterrupt we sent, or
    an unsignalled exit other than 0 (done) or 1 (problems found, each listed)."""
    if sig is not None:
        child.wait_for("S")
        if child.wait_for("E", timeout=rng.uniform(0.0, 0.6)) is None:
            child.send(sig)
            TALLY.add(faults=1, retention_signals=1)
    code = child.finish()
    crashed = "Traceback" in child.stderr and not (
        child.signals and "KeyboardInterrupt" in child.stderr)
    assert not crashed, f"{context}: the step crashed ({code}):\n{child.stderr[-3000:]}"
    if not child.signals:
        assert code in (0, 1), f"{context}: exit {code}:\n{child.stderr[-3000:]}"
    said = " + " + child.signals[0].name if child.signals else ""
    return said + _outcome(out)


def _outcome(out: Path) -> str:
    """What a step that finished printed, in short: a prune's removals and compactions."""
    try:
        done = json.loads(out.read_text())
    except (OSError, ValueError):
        return ""
    if done.get("schema") != "walj.prune/1":
        return f" ({done.get('error') or 'done'})"
    acted = [f"{Path(s['path']).name} {s['action']}" for s in done["sessions"]
             if s["action"] not in ("kept_young", "kept_active", "kept_blocked", "busy",
                                    "kept_problem")]
    counts = done["counts"]
    TALLY.add(retention_removed=counts.get("removed", 0),
              retention_compacted=counts.get("compacted", 0),
              retention_tombstones_finished=counts.get("finished_removal", 0))
    return f" ({', '.join(acted) or 'nothing done'})"


def _prune_args(tree: Tree, url: str) -> list[str]:
    return ["prune", str(tree.root), "--older-than", "0s", "--archive", url,
            "--jobs", "1", "--json"]


def _step(tree: Tree, url: str, env: dict[str, str], work: Path, rng: random.Random,
          context: str) -> str:
    """One random retention step; what it was and did, for a failure's message."""
    out = work / f"out-{rng.randrange(10**9)}.json"
    kind = rng.choice(["prune", "prune", "two prunes", "archive", "compact"])
    if kind == "prune":
        return "prune" + _run("cli", _prune_args(tree, url), env, out, rng, _signal(rng),
                              f"{context}: prune")
    if kind == "two prunes":
        first, second = (Child("child_retention_run.py", [json.dumps(env), str(path), "cli",
                                                          *_prune_args(tree, url)])
                         for path in (out, out.with_suffix(".2.json")))
        did = _finish(first, out, rng, rng.choice([None, signal.SIGKILL]),
                      f"{context}: the first of two prunes at once")
        did_too = _finish(second, out.with_suffix(".2.json"), rng, None,
                          f"{context}: the second of two prunes at once")
        return f"two prunes at once [{did.strip()}] [{did_too.strip()}]"
    local = [p for p in look(tree.root).sessions if p not in tree.held]
    if not local:
        return f"{kind}: no session left"
    forks = [p for p in local if p in tree.forks]
    target = rng.choice(forks) if forks and rng.random() < 0.6 else rng.choice(local)
    name = str(target.relative_to(tree.root))
    sig = rng.choice([None, None, signal.SIGKILL])
    if kind == "archive":
        return f"archive {name}" + _run("cli", ["archive", str(target), "--to", url, "--json"],
                                        env, out, rng, sig, f"{context}: archive {name}")
    return f"compact {name}" + _run("compact", [str(target), url, str(rng.randint(0, 2))],
                                    env, out, rng, sig, f"{context}: compact {name}")


def one_trial(base: Path, trial: int, url: str, env: dict[str, str], target: str) -> None:
    rng = rng_for(f"retention-{target}-{trial}")
    base.mkdir()
    tree = build_tree(rng, base, f"{SEED}-{target}-{trial}")
    store = Store(url, env)
    truth = Truth()
    done: list[str] = []
    try:
        for _ in range(STEPS):
            truth.gather(tree)
            done.append(_step(tree, url, env, base, rng, f"{target} trial {trial}"))
            truth.check(store, tree, f"{target} trial {trial}, {tree.describe()}, after "
                        + "; ".join(done))
        truth.gather(tree)
        done.append("a last prune" + _run("cli", _prune_args(tree, url), env,
                                          base / "last.json", rng, None,
                                          f"{target} trial {trial}: the last prune"))
        context = f"{target} trial {trial}, {tree.describe()}, after " + "; ".join(done)
        figures = truth.check(store, tree, context)
        left = look(tree.root).tombstones
        assert not left, f"{context}: the last prune left tombstones: {left}"
    finally:
        tree.release()
    TALLY.add(trials_retention=1, retention_sessions=figures["sessions"],
              retention_records=figures["records"], checked=figures["records"],
              retention_kept_bytes=figures["bytes"], retention_signals=0,
              retention_removed=0, retention_compacted=0, retention_bytes_lost=0)


def test_retention_torture_file_archive(tmp_path: Path) -> None:
    for trial in range(FILE_TRIALS):
        url = f"file://{tmp_path / f'archive{trial}'}"
        one_trial(tmp_path / f"trial{trial}", trial, url, {}, "file")


def test_retention_torture_s3_archive(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env: dict[str, str] = request.getfixturevalue("moto_env")
    endpoint: str = request.getfixturevalue("s3_endpoint")
    from archive_helpers import make_bucket

    for trial in range(S3_TRIALS):
        url = f"s3://{make_bucket(endpoint)}/sessions"
        one_trial(tmp_path / f"trial{trial}", trial, url, env, "s3")


def _resolve_blocker(tree: Tree, archive: str) -> None:
    with walj.ToolJournal.open(tree.root / "blocked") as journal:
        for blocker in journal.recovery.blockers:
            assert blocker.execution_id is not None
            journal.resolve(blocker.execution_id, "not_performed", note="test", actor="test")


def _edit_archived_object(tree: Tree, archive: str) -> None:
    segment = sorted(Path(archive.removeprefix("file://")).glob("*/seg-*.jsonl"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 1
    segment.write_bytes(bytes(data))


DAMAGE = {
    "a segment deleted": (lambda tree, _: (tree.root / "unarchived" / SEGMENT).unlink(),
                          "acknowledged records are neither on disk nor"),
    "an archived object edited": (_edit_archived_object, "does not verify"),
    # Not "ended": shipping it archived its quarantine, which is then no loss.
    "a quarantine deleted": (lambda tree, _: shutil.rmtree(tree.root / "unarchived" /
                                                           "quarantine"),
                             "quarantined or unknown bytes are neither"),
    "an unknown file deleted": (lambda tree, _: tree.unknown[0].unlink(),
                                "quarantined or unknown bytes are neither"),
    "a blocker resolved": (_resolve_blocker, "no longer blocks"),
    "a held session touched": (lambda tree, _: (tree.root / "held" / "x").write_bytes(b"x"),
                               "was touched"),
}
SEGMENT = "seg-0000000001.jsonl"


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_retention_oracle_catches_what_it_guards(tmp_path: Path, damage: str) -> None:
    """The oracle passes a tree whose only change is an archived session removed locally, and
    fails each kind of loss it exists to catch, with a message that says which."""
    tree = Tree(tmp_path / "root", tmp_path / "outside")
    tree.root.mkdir()
    tree.outside.mkdir()
    for name, kind, quarantine in (("ended", "ended", True), ("unarchived", "ended", True),
                                   ("gone", "ended", False), ("blocked", "blocked", False),
                                   ("held", "idle", False)):
        make_session(tree.root / name, kind, 3, 1024, "oracle", quarantine)
        tree.kinds[tree.root / name] = kind
    tree.held[tree.root / "held"] = hold_open(tree.root / "held", "oracle")
    tree.unknown.append(tree.root / "notes.txt")
    tree.unknown[0].write_bytes(b"not walj's\n")
    archive = f"file://{tmp_path / 'archive'}"
    try:
        truth = Truth()
        truth.gather(tree)
        for name in ("ended", "gone"):
            walj.archive.ship(tree.root / name, archive)
        shutil.rmtree(tree.root / "gone")  # every record of it is in a verified object
        truth.check(Store(archive, {}), tree, "untouched", tally=False)
        change, message = DAMAGE[damage]
        change(tree, archive)
        with pytest.raises(AssertionError, match=message):
            truth.check(Store(archive, {}), tree, damage, tally=False)
    finally:
        tree.release()
