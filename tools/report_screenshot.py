"""Make docs/report.png: the `walj report` page of what `walj demo` leaves, as headless Chromium
(the distribution's, as the browser test uses) draws it.

    python3 tools/report_screenshot.py [--output docs/report.png] [--chromium /usr/bin/chromium]

It runs this repository's walj (`python -m walj demo`, then `walj report`) in a temporary
directory, with relative paths, so the picture shows no path of the machine that made it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO / "docs" / "report.png"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def walj(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WALJ_NO_PROGRESS": "1"}
    return subprocess.run([sys.executable, "-m", "walj", *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def shoot(chromium: str, page: Path, output: Path, size: str, profile: Path) -> None:
    tmp = output.with_name(output.name + ".tmp.png")
    done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}",
                           f"--window-size={size}", f"--screenshot={tmp}", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 or not tmp.is_file():
        raise SystemExit(f"report_screenshot: {chromium} made no screenshot:\n{done.stderr}")
    os.replace(tmp, output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", "-o", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--size", default="1200,1200", help="window WIDTH,HEIGHT in pixels")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="walj-screenshot-") as staging:
        work = Path(staging)
        demo = walj("demo", "demo", cwd=work)
        if demo.returncode != 0:
            raise SystemExit(f"report_screenshot: walj demo failed:\n{demo.stderr}")
        report = walj("report", "demo", "-o", "report.html", "--jobs", "1", cwd=work)
        if report.returncode not in (0, 1):
            raise SystemExit(f"report_screenshot: walj report failed:\n{report.stderr}")
        shoot(args.chromium, work / "report.html", args.output.resolve(), args.size,
              work / "profile")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
