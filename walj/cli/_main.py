"""The argument parser and `main`: one subcommand per concern, errors as one line, exit codes."""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import WaljError
from ._audit_args import add_audit_parser
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    CliError,
    os_error,
    printable,
)

READ_COMMANDS = ("verify", "inspect", "dump", "tail", "timeline", "stats", "sweep", "approvals",
                 "report", "audit")
WRITE_COMMANDS = ("resolve", "repair", "demo", "archive", "prune", "approve", "deny")

EPILOG = """\
exit codes: 0 clean or done; 1 problems found (damage, a blocked journal, a refused write);
2 usage error or unreadable input; 3 `resolve`, `approve` or `deny` queued (the live writer
did not answer in time); 130 interrupted (Ctrl-C; `tail -f` exits 0 instead).
Read commands take no lock and never write: they work on a copied log, a read-only file
system, and beside a live writer. `%(prog)s COMMAND --help` describes each command; every
--json output names its schema and version in its "schema" field."""

# What `walj resolve` writes, and what the next dispatch of the call id does after it (replay:
# walj/journal/_replay.py; a call id is settled by `succeeded` or `failed` only).
RESOLVE_EPILOG = """\
outcomes, and what the next dispatch of the call id (same arguments) does then:
  succeeded      done: answered `ok` from this resolution; the tool does not run
  failed         it failed: answered `error` with the --note; the tool does not run
  not_performed  no effect: the tool runs again (new execution, same idempotency key)
  reviewed       QUARANTINE_FILE only: the cut bytes stop blocking; a call cut whole runs
The same call id with other arguments is refused and runs nothing. --turn N (with no
--outcome): the interrupted turn stops blocking, and nothing of it runs again."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{message} (see `{self.prog} --help`)")


FORENSIC_DOCUMENTATION = "documentation: the README of the walj package (pip install walj)"


def documentation() -> str:
    """Where this walj's documentation is: the project URLs its installed metadata names,
    else the README the installed package carries (its metadata's description). Never a path
    inside the source tree, which an installed walj does not have."""
    from importlib import metadata

    try:
        distribution = metadata.distribution("walj")
    except metadata.PackageNotFoundError:  # a zipapp, or a source tree never installed
        return FORENSIC_DOCUMENTATION
    info = distribution.metadata
    urls = [str(url).partition(",")[2].strip() for url in info.get_all("Project-URL") or []]
    urls += [str(info["Home-page"])] if info["Home-page"] else []
    if urls:
        return "documentation: " + ", ".join(url for url in urls if url)
    # METADATA in a wheel's dist-info; PKG-INFO in the egg-info an editable install leaves.
    readme = next((f for f in distribution.files or () if f.name in ("METADATA", "PKG-INFO")),
                  None)
    where = (f":\n  {os.path.abspath(str(distribution.locate_file(readme)))}" if readme is not None
             else "")
    return (f"documentation: the README installed with walj {info['Version']}, the description "
            f"in its package metadata{where}")


class _TopParser(_Parser):
    """The `walj` parser: its help ends with where the documentation is, looked up only then."""

    def format_help(self) -> str:
        # The read-only zipapp carries no package metadata; an installed walj found beside it
        # may be another version.
        where = documentation() if self.prog == "walj" else FORENSIC_DOCUMENTATION
        self.epilog = f"{EPILOG}\n{where.replace('%', '%%')}"  # argparse expands %(prog)s
        return super().format_help()


_JSON = ("--json", "print the documented JSON schema")
_JSON_LINES = ("--json", "JSON Lines: {\"seq\", \"data\"} per line")
_KINDS_HELP = "only records of this kind (`k`), e.g. tool_execution_started; repeat"
_ARCHIVE_HELP = ("the archive PATH was shipped to: read its archived segments, then PATH's own "
                 "(PATH may also be an archived session's URL itself)")
_JOBS = ("--jobs", "-j")


def _flags(p: argparse.ArgumentParser, *flags: tuple[str, str]) -> None:
    """On/off options, each (flag, help), in the order --help lists them."""
    for flag, text in flags:
        p.add_argument(flag, action="store_true", help=text)


def _engines() -> str:
    """Which checksum and JSON implementations this process uses: C or the stdlib fallback."""
    from .. import _codec
    from ..log import format as fmt

    return (f"checksums: {'pure-Python XXH64' if fmt.PURE_XXH64 else 'xxhash'}; "
            f"JSON: {'msgspec' if _codec.HAVE_MSGSPEC else 'json (stdlib)'}")


def _waiting(p: argparse.ArgumentParser, what: str) -> None:
    waiting = p.add_mutually_exclusive_group()
    waiting.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                         help=f"how long to wait for a live writer to apply {what} (default 10)")
    waiting.add_argument("--no-wait", action="store_true",
                         help="leave the request for the live writer and exit 3 at once")


def _approval_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """`approvals`, `approve` and `deny` (walj/cli/_approvals.py)."""
    p = command("approvals", "pending approval requests, and approved ones not used yet, of "
                "every session under ROOT", "root", "ROOT")
    p.add_argument(*_JOBS, type=int, default=None, metavar="N",
                   help="worker processes (default: CPU count, at most 8; 1: none)")
    _flags(p, ("--all", "list expired approvals too"), _JSON)
    for name, text in (("approve", "approve a pending request durably: the call it names, "
                        "with exactly its arguments, may then run once"),
                       ("deny", "deny a pending request durably: the call it names never runs")):
        p = command(name, text + " (a live writer applies it)")
        p.add_argument("approval_id", metavar="APPROVAL_ID", help="as `walj approvals` lists it")
        p.add_argument("--actor", required=True, metavar="NAME", help="who decides")
        p.add_argument("--note", default=None, metavar="TEXT", help="why: what you checked")
        if name == "approve":
            expiry = p.add_mutually_exclusive_group()
            expiry.add_argument("--expires-in", metavar="DURATION",
                                help="the approval lapses unused after this long: 30m, 12h, 7d")
            expiry.add_argument("--expires-at", metavar="ISO8601",
                                help="... or at this time (2026-12-05T18:00:00Z; no offset: "
                                "UTC)")
        _waiting(p, "it")
        _flags(p, _JSON)


def build_parser(prog: str = "walj") -> argparse.ArgumentParser:
    from .. import __version__

    parser = _TopParser(prog=prog, description="Forensic and recovery tools for walj logs and "
                        "tool journals.", epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__} ({_engines()})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, text: str, where: str = "path", metavar: str = "PATH",
                **options: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, **options)
        p.add_argument(where, metavar=metavar)
        return p

    p = command("verify", "check checksums, seqs, headers, seals and the seal chain")
    _flags(p, ("--strict", "count a torn tail as a problem"))
    p.add_argument("--archive", metavar="URL", help=_ARCHIVE_HELP)
    _flags(p, _JSON)

    p = command("inspect", "the recovery state: blockers, incomplete turns, pending LLM calls, "
                "resolutions (or one execution's history)")
    p.add_argument("execution_id", metavar="EXECUTION_ID", nargs="?",
                   help="show every record of this execution (id or unique prefix)")
    p.add_argument("--archive", metavar="URL", help=_ARCHIVE_HELP)
    _flags(p, _JSON)

    p = command("dump", "records in order")
    p.add_argument("--from-seq", type=int, default=0, metavar="N")
    p.add_argument("--to-seq", type=int, default=None, metavar="N")
    p.add_argument("--archive", metavar="URL", help=_ARCHIVE_HELP)
    p.add_argument("--kind", action="append", metavar="K", help=_KINDS_HELP)
    _flags(p, _JSON_LINES)

    p = command("tail", "the last records; -f follows new ones across rotation")
    p.add_argument("-f", "--follow", action="store_true", help="follow until Ctrl-C")
    p.add_argument("-n", "--lines", type=int, default=10, metavar="N",
                   help="how many of the last records to show first (default 10)")
    p.add_argument("--from-seq", type=int, default=None, metavar="N",
                   help="show from this seq instead of the last N")
    p.add_argument("--interval", type=float, default=0.2, metavar="SECONDS",
                   help="polling interval when following (default 0.2)")
    p.add_argument("--kind", action="append", metavar="K", help=_KINDS_HELP)
    _flags(p, _JSON_LINES)

    p = command("timeline", "turns as a tree of executions, outcomes, durations")
    p.add_argument("--last", type=int, default=None, metavar="N", help="only the last N turns")
    _flags(p, _JSON)

    _flags(command("stats", "segments, bytes, records by kind, per-tool numbers"), _JSON)

    p = command("sweep", "every session log under ROOT: active, ended, blocked or corrupt",
                "root", "ROOT")
    p.add_argument(*_JOBS, type=int, default=None, metavar="N",
                   help="worker processes (default: CPU count, at most 8; 1: none)")
    _flags(p, ("--all", "list active and ended logs too"), _JSON)

    p = command("report", "every session as one self-contained HTML page, blocked first",
                "source", "ROOT|PATH|URL", description="Write one HTML page (no script, nothing "
                "fetched) of every session under ROOT, of one session, or of an archive's URL: "
                "blocked sessions first, each blocker with the `walj resolve` command that "
                "settles it; read-only, no lock.")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    p.add_argument("--archive", metavar="URL", help="the archive the sessions were shipped to: "
                   "read each one's archived segments, then its own")
    p.add_argument("--detail", type=int, default=50, metavar="N", help="sessions shown in "
                   "full, blocked first (default 50); every other one has a summary row")
    p.add_argument(*_JOBS, type=int, default=None, metavar="N",
                   help="worker processes (default: CPU count, at most 8; 1: none)")

    _approval_commands(command)

    p = command("resolve", "resolve a blocker durably (a live writer applies it)",
                description="Resolve a blocker durably, under the writer lock or, while a live "
                "process holds the session, by a request that process applies: a "
                "tool_execution_resolved,\nturn_resolved or log_cut_resolved record says what "
                "happened, who says so and why.",
                epilog=RESOLVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("execution_id", metavar="EXECUTION_ID", nargs="?")
    p.add_argument("--turn", type=int, default=None, metavar="N",
                   help="resolve interrupted turn N instead of an execution")
    p.add_argument("--outcome", choices=("succeeded", "failed", "not_performed", "reviewed"),
                   help="what happened; see below for what each does to the next dispatch")
    p.add_argument("--note", required=True, metavar="TEXT", help="why: what you checked")
    p.add_argument("--actor", required=True, metavar="NAME", help="who resolves it")
    waiting = p.add_mutually_exclusive_group()
    waiting.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                         help="how long to wait for a live writer to apply it (default 10)")
    waiting.add_argument("--no-wait", action="store_true",
                         help="leave the request for the live writer and exit 3 at once")
    _flags(p, _JSON)

    _flags(command("repair", "cut a torn tail or damaged suffix into quarantine/"),
           ("--dry-run", "show the cut, change nothing"), _JSON)

    p = command("archive", "copy sealed segments to URL/<log id>/ and verify each copy; never "
                "deletes", metavar="SESSION_DIR")
    p.add_argument("--to", required=True, metavar="URL",
                   help="s3://bucket/prefix, file:///path, a local path, or any fsspec URL")
    _flags(p, ("--recheck", "read every archived copy back in full, not just its size and ends"),
           _JSON)

    p = command("prune", "retention over ROOT: archive then remove old ended sessions, compact "
                "old active ones; never a blocked one", "root", "ROOT")
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="only sessions whose last record is older: 30d, 12h, 90m, 45s, 2w")
    p.add_argument("--archive", metavar="URL", help="ship every segment here and read it back "
                   "before anything local is deleted (s3://bucket/prefix, file:///path, ...)")
    _flags(p, ("--delete-unarchived", "remove old ended sessions without archiving them first"),
           ("--include-idle", "also end and remove an active session with no blocker, no live "
            "writer and no record newer than --older-than"))
    p.add_argument("--keep-turns", type=int, default=0, metavar="N",
                   help="compaction keeps the last N turns readable locally (default 0)")
    _flags(p, ("--dry-run", "say what would be done, do nothing"))
    p.add_argument(*_JOBS, type=int, default=None, metavar="N",
                   help="worker processes for the checks (default: CPU count, at most 8)")
    _flags(p, ("--all", "list young and active sessions too"), _JSON)

    add_audit_parser(sub)

    p = sub.add_parser("demo", help="crash an agent mid-tool, then inspect, resolve, resume")
    p.add_argument("dir", metavar="DIR", nargs="?", help="where to leave it (default: new "
                   "temporary directory)")
    return parser


# Each command's module and function, imported only when the command runs.
_COMMANDS = {"verify": ("_logcmds", "cmd_verify"), "stats": ("_logcmds", "cmd_stats"),
             "dump": ("_records", "cmd_dump"), "tail": ("_records", "cmd_tail"),
             "inspect": ("_inspect", "cmd_inspect"), "timeline": ("_timeline", "cmd_timeline"),
             "sweep": ("_sweep", "cmd_sweep"), "archive": ("_archive", "cmd_archive"),
             "prune": ("_prune", "cmd_prune"), "resolve": ("_write", "cmd_resolve"),
             "repair": ("_write", "cmd_repair"), "audit": ("_audit", "cmd_audit"),
             "report": ("_report", "cmd_report"), "approvals": ("_approvals", "cmd_approvals"),
             "approve": ("_approvals", "cmd_approve"), "deny": ("_approvals", "cmd_deny")}


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    if name == "demo":
        from ._demo import cmd_demo

        return functools.partial(cmd_demo, run=main)
    module, function = _COMMANDS[name]
    command: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"{__package__}.{module}"), function)
    return command


def main(argv: Sequence[str] | None = None, *, forensic: bool = False) -> int:
    """Run one `walj` command; returns its exit code. `forensic=True` is the read-only
    zipapp: the commands that write refuse."""
    prog = "walj-forensic.pyz" if forensic else "walj"
    try:
        args = build_parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.command is None:
            build_parser(prog).print_help()
            return EXIT_USAGE
        if forensic and args.command in WRITE_COMMANDS:
            raise CliError(f"`{args.command}` writes, and this tool is read-only: use the walj "
                           f"package for it (pip install walj); here: {', '.join(READ_COMMANDS)}")
        return _command(args.command)(args)
    except CliError as exc:
        _error(prog, str(exc))
        return exc.code
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        _error(prog, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except OSError as exc:
        _error(prog, str(os_error(exc)))
        return EXIT_USAGE
    except WaljError as exc:
        _error(prog, " ".join(str(exc).split()))
        return EXIT_PROBLEMS


def _error(prog: str, message: str) -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _quiet_stdout()
    # The message may quote the log (a path, a record's field): printable, like every view.
    sys.stderr.write(printable(f"{prog}: error: {message}") + "\n")


def _quiet_stdout() -> None:
    """After a closed pipe (`walj dump ... | head`), send the rest to /dev/null so that the
    interpreter's final flush does not print a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
