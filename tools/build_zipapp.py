"""Build walj-forensic.pyz: the repository's own `walj` package, zipped with zipapp, runnable by
any python3 >= 3.10 with nothing installed; read commands only.

    python3 tools/build_zipapp.py [--output dist/walj-forensic.pyz]
    python3 dist/walj-forensic.pyz verify /path/to/copied/log
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import zipapp
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "walj"
DEFAULT_OUTPUT = REPO / "dist" / "walj-forensic.pyz"

# The zipapp's entry point. The version check comes before any import of walj, so an older
# interpreter gets a clear message instead of a syntax error.
MAIN = '''\
"""walj-forensic.pyz: verify, inspect, dump, tail, timeline, stats, sweep and report on walj
logs, read-only, with the standard library alone."""

import sys

if sys.version_info < (3, 10):
    sys.stderr.write("walj-forensic.pyz needs Python 3.10 or newer; this is %d.%d\\n"
                     % sys.version_info[:2])
    sys.exit(2)

from walj.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(forensic=True))
'''


def package_files() -> list[Path]:
    """Every source file of the walj package (no caches), in a stable order."""
    files = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files)


def build(output: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="walj-zipapp-") as staging:
        root = Path(staging)
        for source in package_files():
            target = root / "walj" / source.relative_to(PACKAGE)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        (root / "__main__.py").write_text(MAIN, encoding="utf-8")
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp = output.with_name(output.name + ".tmp")
        zipapp.create_archive(root, target=tmp, interpreter="/usr/bin/env python3",
                              compressed=True)
        os.replace(tmp, output)
    return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", "-o", type=Path, default=DEFAULT_OUTPUT,
                        help="where to write the zipapp (default: dist/walj-forensic.pyz)")
    args = parser.parse_args(argv)
    if not (PACKAGE / "log" / "_xxh64.py").exists():
        sys.stderr.write("build_zipapp: walj/log/_xxh64.py is missing; without it the zipapp "
                         "cannot verify checksums where xxhash is not installed\n")
        return 1
    output = build(args.output)
    count = len(package_files())
    print(f"built {output} ({count} modules, {output.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
