"""Two commits of walj side by side: journal record size, journal open rate, dispatch rate.

    python benchmarks/compare_commits.py 627d000 HEAD            # 5 interleaved rounds
    python benchmarks/compare_commits.py OLD NEW --records 300000 --rounds 7

For a change to the record format or the write path, whose cost shows only against the code
before it. Each commit is checked out into a temporary git worktree; every measurement runs in
a fresh interpreter that imports that worktree's walj, and the rounds alternate between the two
commits, so that a shared machine's drift hits both alike. Reported: bytes per journal record
(the same turns of ten no-op calls written by each commit), `ToolJournal.open` of about
`--records` records (records/s), and durable no-op `dispatch` with `sync="always"` (calls/s),
each a median over the rounds, with the new/old ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Run inside the child, with the commit's worktree first on sys.path.
CHILD = r'''
import json, os, sys, time
from pathlib import Path
mode, target, n, seconds = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
if mode == "build":
    os.fsync = lambda fd: None  # building only: no figure is taken in this process
    os.fdatasync = lambda fd: None
import walj
def noop(**kw): return None
if mode == "build":
    try:  # one record time for all: a record's size must not depend on the clock's digits
        import walj.journal._writes as writes
        writes.now = lambda: 1796193983.125
    except ImportError:
        pass  # a commit from before records were built there
    def fill(path, turns):
        with walj.ToolJournal.open(path, tools={"noop": noop}, sync="never") as j:
            for t in range(turns):
                with j.turn() as turn:
                    for k in range(10):
                        turn.dispatch("noop", {"turn": t, "k": k, "q": "x" * 64})
    probe = target.parent / (target.name + ".probe")
    fill(probe, 2)
    per_turn = max(1, sum(1 for _ in walj.read(probe)) // 2)
    fill(target, -(-n // per_turn))
    records = sum(1 for _ in walj.read(target))
    disk = sum(p.stat().st_size for p in target.iterdir()
               if p.is_file() and p.name not in ("LOCK", "LOCK.owner"))
    print(json.dumps({"records": records, "disk_bytes": disk}))
elif mode == "open":
    t0 = time.perf_counter()
    walj.ToolJournal.open(target, tools={"noop": noop}).close()
    print(json.dumps({"seconds": time.perf_counter() - t0}))
elif mode == "dispatch":
    with walj.ToolJournal.open(target, tools={"noop": noop}, sync="always") as j:
        with j.turn() as turn:
            i, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                turn.dispatch("noop", {"x": i})
                i += 1
            print(json.dumps({"rate": i / (time.perf_counter() - t0)}))
'''


def run(tree: Path, *args: str) -> dict[str, float]:
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); sys.argv[1:] = {list(args)!r}\n"
    out = subprocess.run([sys.executable, "-c", code + CHILD], capture_output=True, text=True,
                         check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per dispatch round")
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    scratch = Path(tempfile.mkdtemp(prefix="walj-compare-"))
    trees = {}
    try:
        for label, rev in (("old", args.old), ("new", args.new)):
            trees[label] = scratch / label
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q",
                            str(trees[label]), rev], check=True)
        built = {label: run(tree, "build", str(scratch / f"{label}-journal"), str(args.records),
                            "0") for label, tree in trees.items()}
        opens: dict[str, list[float]] = {"old": [], "new": []}
        rates: dict[str, list[float]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for label in order:
                secs = run(trees[label], "open", str(scratch / f"{label}-journal"), "0",
                           "0")["seconds"]
                opens[label].append(built[label]["records"] / secs)
                rates[label].append(run(trees[label], "dispatch",
                                        str(scratch / f"{label}-d{r}"), "0",
                                        str(args.seconds))["rate"])
        print(f"{args.old} (old) against {args.new} (new), {args.rounds} interleaved rounds")
        per = {k: built[k]["disk_bytes"] / built[k]["records"] for k in built}
        print(f"bytes per journal record on disk: old {per['old']:.0f}, new {per['new']:.0f} "
              f"({per['new'] / per['old']:.2f}x)")
        for name, series, unit in (("journal open", opens, "rec/s"),
                                   ("durable dispatch", rates, "calls/s")):
            old, new = statistics.median(series["old"]), statistics.median(series["new"])
            rounds = ", ".join(f"{n / o:.2f}" for o, n in zip(series["old"], series["new"],
                                                                 strict=True))
            print(f"{name}: old {old:,.0f} {unit}, new {new:,.0f} {unit} ({new / old:.2f}x); "
                  f"rounds new/old: {rounds}")
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                           check=False)
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
