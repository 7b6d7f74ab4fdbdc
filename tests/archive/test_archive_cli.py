"""`walj archive` and the read commands on archive URLs, in child processes as a user runs
them; endpoints given by environment variables alone; and walj without the s3 extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from archive_helpers import Archive, aws_env, make_bucket, make_session
from cli_helpers import flip_byte, make_journal, record_offset

import walj
import walj.archive as archive_mod
from walj.cli import main

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str | os.PathLike[str], env: dict[str, str] | None = None) -> tuple[int, str,
                                                                                  str]:
    """`python -m walj ARGS`, in this test's environment (or exactly `env`, plus the path)."""
    full = dict(os.environ if env is None else env)
    full["PYTHONPATH"] = str(REPO)
    full["WALJ_NO_PROGRESS"] = "1"
    if env is not None:
        full["PATH"] = os.environ.get("PATH", "")
    done = subprocess.run([sys.executable, "-m", "walj", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=full, cwd=REPO, check=False)
    return done.returncode, done.stdout, done.stderr


def run(capsys: pytest.CaptureFixture[str], *args: str | os.PathLike[str]) -> tuple[int, str,
                                                                                  str]:
    """The CLI's `main` in this process (the child processes are kept for the endpoint
    variables, which fsspec reads once at import)."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def sealed_journal(path: Path, **options: Any) -> None:
    """A journal whose every record is in a sealed segment: reopening with a larger
    max_record_bytes rotates first, so the whole session is archivable."""
    make_journal(path, turns=1, segment_bytes=1024, max_record_bytes=65536, **options)
    walj.Log.open(path, max_record_bytes=131072).close()


def test_cli_ships_then_reads_the_archive(archive: Archive, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    session = tmp_path / "s"
    make_session(session)
    code, out, err = run(capsys, "archive", session, "--to", archive.url, "--json")
    assert code == 0, err
    shipped = json.loads(out)
    assert shipped["schema"] == "walj.archive/2" and shipped["shipped"] and not shipped["skipped"]
    url = shipped["url"]
    code, out, _ = run(capsys, "archive", session, "--to", archive.url, "--json")
    assert code == 0 and json.loads(out)["shipped"] == []

    code, out, _ = run(capsys, "verify", url, "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["segments"] == shipped["shipped"]
    code, out, _ = run(capsys, "dump", url, "--json")
    dumped = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [d["data"] for d in dumped] == [
        r.data for r in archive_mod.read(url)]
    # The local tail continues the archive, with the chain checked across the boundary.
    for seg in sorted(session.glob("seg-*.jsonl"))[:-1]:
        seg.unlink()
    code, out, err = run(capsys, "verify", session, "--archive", archive.url, "--json")
    both = json.loads(out)
    assert code == 0 and both["ok"] and both["records"] == 60, err
    code, out, _ = run(capsys, "dump", session, "--archive", archive.url, "--json",
                       "--from-seq", "58")
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [58, 59, 60]
    code, _, err = run(capsys, "verify", session, "--json")
    assert code == 1  # alone, the tail's first segment chains to a seal that is not there


def test_sweep_and_inspect_over_an_archived_root(archive: Archive, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("clean-1", "clean-2", "blocked", "corrupt"):
        sealed_journal(tmp_path / name, blocked=name == "blocked")
        assert archive_mod.ship(tmp_path / name, archive.url).shipped
    ids = {name: walj.verify(tmp_path / name).log_id for name in
           ("clean-1", "clean-2", "blocked", "corrupt")}
    first = sorted((tmp_path / "corrupt").glob("seg-*.jsonl"))[0]
    key = f"{ids['corrupt']}/{first.name}"
    edited = tmp_path / "edited"
    edited.write_bytes(archive.get(key))
    flip_byte(edited, record_offset(edited, b'"kind":"turn_started"'))
    archive.put(key, edited.read_bytes())

    code, out, err = run(capsys, "sweep", archive.url, "--json", "--all")
    assert code == 1, err
    swept = json.loads(out)
    status = {e["path"].rsplit("/", 1)[1]: e["status"] for e in swept["sessions"]}
    assert status == {ids["clean-1"]: "active", ids["clean-2"]: "active",
                      ids["blocked"]: "blocked", ids["corrupt"]: "corrupt"}
    assert swept["counts"]["blocked"] == 1 and swept["counts"]["corrupt"] == 1
    code, out, _ = run(capsys, "inspect", f"{archive.url}/{ids['blocked']}", "--json")
    inspected = json.loads(out)
    assert code == 1 and inspected["blocked"] and inspected["log_ok"]
    assert [b["tool"] for b in inspected["blockers"]] == ["send"]


@pytest.mark.parametrize("variable", ["FSSPEC_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_endpoint_from_one_environment_variable_alone(
        variable: str, s3_endpoint: str, tmp_path: Path) -> None:
    bucket = make_bucket(s3_endpoint)
    session = tmp_path / "s"
    make_session(session, 30)
    env = aws_env(tmp_path)
    env[variable] = s3_endpoint
    code, out, err = cli("archive", session, "--to", f"s3://{bucket}/a", "--json", env=env)
    assert code == 0, err
    url = json.loads(out)["url"]
    assert url.startswith(f"s3://{bucket}/a/")
    code, out, err = cli("verify", url, "--json", env=env)
    assert code == 0 and json.loads(out)["ok"], err
    # Without it there is no endpoint but AWS's, and the test proxy refuses that: an error,
    # not a silent success elsewhere.
    del env[variable]
    env["AWS_MAX_ATTEMPTS"] = "1"
    code, out, err = cli("verify", url, "--json", env={**env, "FSSPEC_S3_CONNECT_TIMEOUT": "2"})
    assert code != 0 and "Traceback" not in err


def test_walj_never_imports_fsspec_and_names_the_extra_when_missing(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "import walj, walj.archive, walj.cli\n"
        "assert 'fsspec' not in sys.modules and 's3fs' not in sys.modules\n"
        "sys.modules['fsspec'] = None\n"
        "try:\n"
        "    walj.archive.verify('s3://bucket/prefix/0123')\n"
        "except ImportError as exc:\n"
        "    assert 'walj[s3]' in str(exc), exc\n"
        "    print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr
    # A local archive needs no extra at all.
    session = tmp_path / "s"
    make_session(session, 30)
    script = ("import sys\nsys.modules['fsspec'] = None\nimport walj.archive\n"
              f"r = walj.archive.ship({str(session)!r}, {str(tmp_path / 'a')!r})\n"
              "assert walj.archive.verify(r.url).ok\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr
