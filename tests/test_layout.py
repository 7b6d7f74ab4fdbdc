"""The package's layers: every public name imports from `walj`, imports run one way only
(log -> journal -> cli, integrations, archive), the journal reaches the log only through its
public surface, there is no circle of imports, and every module says what it is for."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "walj"
ABOVE_THE_LOG = ("walj.journal", "walj.cli", "walj.integrations", "walj.archive")
ABOVE_THE_JOURNAL = ("walj.cli", "walj.integrations", "walj.archive")
# Beside the layers, shared by all: what they may take from the top package (which itself
# imports every layer, so anything else taken from it would climb).
SHARED = {"errors", "_codec", "_deepjson"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
            if "__pycache__" not in p.parts}


def imports_of(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import in the file, relative
    ones resolved, those under `if TYPE_CHECKING:` and inside functions included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names], node.lineno))
    return found


def edges() -> dict[str, set[str]]:
    """Each walj module to the walj modules it imports; `from pkg import sub` names the
    submodule when there is one."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for target, names, _ in imports_of(name, path):
            if not target.startswith("walj"):
                continue
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            graph[name].update(subs or [target])
    return graph


def test_every_public_name_imports_from_walj() -> None:
    """In a fresh interpreter, as a user's code would: `from walj import <name>` for every
    name of walj.__all__, each the object walj holds."""
    import walj

    assert len(walj.__all__) == len(set(walj.__all__)) > 20
    script = ("import walj\n"
              "for name in walj.__all__:\n"
              "    exec(f'from walj import {name} as value')\n"
              "    assert value is getattr(walj, name), name\n"
              "print(len(walj.__all__))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(walj.__all__))
    for name in ("Log", "read", "verify", "ToolJournal", "Tool", "WaljError", "Recovery",
                 "Blocker", "ResolutionError", "CorruptionError"):
        assert name in walj.__all__, name


@pytest.mark.parametrize(("layer", "above"), [("walj.log", ABOVE_THE_LOG),
                                                ("walj.journal", ABOVE_THE_JOURNAL)])
def test_no_layer_imports_a_layer_above_it(layer: str, above: tuple[str, ...]) -> None:
    wrong = [f"{name}:{line} imports {target} {names}"
             for name, path in modules().items() if name == layer or name.startswith(layer + ".")
             for target, names, line in imports_of(name, path)
             if any(target == a or target.startswith(a + ".") for a in above)
             or (target == "walj" and not set(names) <= SHARED)]
    assert wrong == []


def test_the_journal_reaches_the_log_only_through_its_public_surface() -> None:
    """From walj.log the journal takes only the names walj.log exports; no private module."""
    import walj.log

    wrong = []
    for name, path in modules().items():
        if not name.startswith("walj.journal"):
            continue
        for target, names, line in imports_of(name, path):
            if target.startswith("walj.log."):
                wrong.append(f"{name}:{line} imports the log's private {target}")
            elif target == "walj.log" and set(names) - set(walj.log.__all__):
                wrong.append(f"{name}:{line} takes {set(names) - set(walj.log.__all__)} "
                             "from walj.log, which does not export them")
    assert wrong == []


def circles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    path: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return circles


def test_no_circle_of_imports() -> None:
    """Between modules, lazy and TYPE_CHECKING imports included. A package's __init__ may
    import its own submodules (it is their public face), so an edge from a submodule back to
    its own package's __init__ is a circle too."""
    assert circles_in(edges()) == []


def test_the_layer_test_sees_a_circle_and_a_climbing_import(tmp_path: Path) -> None:
    """The checks above on a made-up package, so they are known to catch what they look for."""
    fake = {"walj.log._a": ["from ..journal import _b"], "walj.journal._b": ["from . import _c"],
            "walj.journal._c": ["from ._b import x"]}
    graph: dict[str, set[str]] = {}
    for name, lines in fake.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text("\n".join(lines) + "\n")
        graph[name] = {t for t, _, _ in imports_of(name, path)}
    assert graph["walj.log._a"] == {"walj.journal"}
    assert graph["walj.journal._b"] == {"walj.journal"}
    assert graph["walj.journal._c"] == {"walj.journal._b"}
    assert circles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles_in({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_every_package_and_module_says_what_it_is_for() -> None:
    missing = [name for name, path in modules().items()
               if not (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")
               .strip()]
    assert missing == []
    for package in ("walj", "walj.log", "walj.journal", "walj.cli", "walj.archive"):
        doc = ast.get_docstring(ast.parse(modules()[package].read_text(encoding="utf-8")))
        assert doc is not None and len(doc.splitlines()) >= 3, package


def test_only_the_archive_stores_module_imports_fsspec() -> None:
    """`import walj` never imports fsspec or s3fs: only walj/archive/_store.py names them, and
    only inside the function that needs them (a missing extra is an ImportError there)."""
    wrong = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(t.split(".")[0] in ("fsspec", "s3fs") for t in targets):
                if name != "walj.archive._store" or node.col_offset == 0:
                    wrong.append(f"{name}:{node.lineno}")
    assert wrong == []


def test_the_log_promises_never_to_read_records_and_the_journal_never_to_touch_files() -> None:
    import walj.journal
    import walj.log

    assert "never interprets a record" in " ".join((walj.log.__doc__ or "").split())
    assert "never touches a file descriptor" in " ".join((walj.journal.__doc__ or "").split())
    for name, path in modules().items():
        if name.startswith("walj.journal"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            calls = {node.func.attr for node in ast.walk(tree)
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                     and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"}
            assert not calls & {"open", "write", "read", "fsync", "fdatasync", "close",
                                "unlink", "rename", "replace"}, (name, calls)
