"""Retention torture workload: one retention step, in a child the parent may SIGKILL or SIGINT.

Usage: child_retention_run.py ENV_JSON STDOUT_PATH STEP ARGS... ORACLE_FD

ENV_JSON is a JSON object of environment variables to set first (the archive's endpoint and
credentials). STEP is `cli` (ARGS are `walj` command-line arguments: `prune ...`, `archive ...`)
or `compact` (ARGS are PATH URL KEEP_TURNS: `ToolJournal.compact(archive=URL)` as the session's
writer). What the step prints goes to STDOUT_PATH.

Oracle lines: `S` once started; `E <code>` when the step returned (a CLI exit code, or 0 for a
compaction); `X <error type>` when the compaction refused with a walj.WaljError.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    env_json, stdout_path, step, *args = sys.argv[1:-1]
    out = int(sys.argv[-1])
    os.environ.update(json.loads(env_json))
    with open(stdout_path, "wb") as sink:
        os.dup2(sink.fileno(), 1)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own

    import walj
    from walj.cli import main as cli

    os.write(out, b"S\n")
    if step == "cli":
        code = cli(args)
        sys.stdout.flush()
        os.write(out, f"E {code}\n".encode())
        sys.exit(code)
    path, url, keep = args
    try:
        with walj.ToolJournal.open(path, lock_timeout=0) as journal:
            report = journal.compact(keep_turns=int(keep), archive=url)
            print(json.dumps({"first_seq": report.first_seq, "archived": list(report.archived)}))
    except walj.WaljError as exc:
        os.write(out, f"X {type(exc).__name__}\n".encode())
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    os.write(out, b"E 0\n")


if __name__ == "__main__":
    main()
