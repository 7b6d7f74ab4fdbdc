"""The package's layers: every public name imports from `walj`, imports run one way only
(log -> journal -> cli, integrations, archive), every layer reaches a lower one only through its
declared surface (the package or a public submodule, the names their `__all__` lists, no
private attribute), there is no circle of imports, and every module says what it is for."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
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
            found.append((imported_from(node, package), [alias.name for alias in node.names],
                          node.lineno))
    return found


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names, a relative one resolved against `package`."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


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


# --- every layer reaches a lower one only through its declared surface ------------------------

LAYER_RANK = {"walj.log": 0, "walj.journal": 1, "walj.cli": 2, "walj.integrations": 2,
              "walj.archive": 2}


def layer_of(module: str) -> str | None:
    return next((layer for layer in LAYER_RANK
                 if module == layer or module.startswith(layer + ".")), None)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def strings_in(node: ast.AST | None) -> set[str]:
    return {e.value for e in getattr(node, "elts", []) if isinstance(e, ast.Constant)}


def exported(tree: ast.Module) -> set[str] | None:
    """The names `__all__` lists (assigned and added to as literals); None if there is none."""
    found = [strings_in(node.value) for node in tree.body
             if isinstance(node, (ast.Assign, ast.AugAssign))
             and "__all__" in {getattr(t, "id", None) for t in getattr(node, "targets", [])}
             | {getattr(getattr(node, "target", None), "id", None)}]
    return set().union(*found) if found else None


def private_attributes(tree: ast.Module) -> set[str]:
    """The private attributes a module's classes define: `self._x = ...`, a `_x` method or
    class attribute, a `_x` slot."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                names = [getattr(t, "id", "") for t in getattr(item, "targets", [])]
                found |= {getattr(item, "name", "")} | set(names)
                if "__slots__" in names:
                    found |= strings_in(getattr(item, "value", None))
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and getattr(node.value, "id", None) in ("self", "cls")):
            found.add(node.attr)
    return {name for name in found if is_private(name)}


@dataclass
class Surface:
    """What the layer check knows of the package: each module's syntax tree, which ones are
    packages, each module's `__all__`, and the private attributes each layer defines."""

    trees: dict[str, ast.Module]
    packages: set[str]
    declared: dict[str, set[str] | None]
    private: dict[str, set[str]]

    @classmethod
    def of(cls, sources: Mapping[str, str], packages: set[str]) -> Surface:
        trees = {name: ast.parse(text) for name, text in sources.items()}
        private: dict[str | None, set[str]] = {layer: set() for layer in [*LAYER_RANK, None]}
        for name, tree in trees.items():
            private[layer_of(name)] |= private_attributes(tree)
        return cls(trees, packages, {n: exported(t) for n, t in trees.items()},
                   {k: v for k, v in private.items() if k is not None})

    @classmethod
    def of_the_package(cls) -> Surface:
        known = modules()
        return cls.of({n: p.read_text(encoding="utf-8") for n, p in known.items()},
                      {n for n, p in known.items() if p.name == "__init__.py"})


def crossings(name: str, surface: Surface) -> list[str]:
    """Where module `name` reaches a lower layer (or the top package, which holds them all)
    other than through a declared name: a private module, a submodule with no `__all__`, a
    name its target does not export or that starts with "_", a private attribute of what it
    took from a lower layer or from `walj`, or a private attribute only a lower layer defines."""
    layer = layer_of(name)
    below = [low for low, rank in LAYER_RANK.items() if layer and rank < LAYER_RANK[layer]]
    package = name if name in surface.packages else name.rpartition(".")[0]
    wrong: list[str] = []
    bound: dict[str, str] = {}  # a local name -> the module it names
    taken: set[str] = set()  # local names of objects taken from a lower layer or from walj

    def lower(module: str) -> bool:
        return any(module == low or module.startswith(low + ".") for low in below)

    def reach(module: str, line: int) -> None:
        if not lower(module):
            return
        if any(part.startswith("_") for part in module.split(".")[1:]):
            wrong.append(f"{name}:{line} imports the private module {module}")
        elif module not in LAYER_RANK and surface.declared.get(module) is None:
            wrong.append(f"{name}:{line} imports {module}, which declares no __all__")

    def take(module: str, what: str, line: int) -> None:
        if is_private(what) or what not in (surface.declared.get(module) or set()):
            wrong.append(f"{name}:{line} takes {what} from {module}, which does not export it")

    def module_of(node: ast.expr) -> str | None:
        """The module an expression names (`walj.journal`, an alias of one), else None."""
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = module_of(node.value)
            if owner is not None and f"{owner}.{node.attr}" in surface.trees:
                return f"{owner}.{node.attr}"
        return None

    for node in ast.walk(surface.trees[name] if below else ast.Module()):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                bound[alias.asname or top] = alias.name if alias.asname else top
                reach(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = imported_from(node, package)
            reach(target, node.lineno)
            for alias in node.names:
                if f"{target}.{alias.name}" in surface.trees:
                    bound[alias.asname or alias.name] = f"{target}.{alias.name}"
                    reach(f"{target}.{alias.name}", node.lineno)
                elif lower(target) or target == "walj":
                    taken.add(alias.asname or alias.name)
                    take(target, alias.name, node.lineno)
    for node in ast.walk(surface.trees[name] if below else ast.Module()):
        if not isinstance(node, ast.Attribute):
            continue
        owner = module_of(node.value)
        if owner is not None and (lower(owner) or owner == "walj"):
            if f"{owner}.{node.attr}" in surface.trees:
                reach(f"{owner}.{node.attr}", node.lineno)
            else:
                take(owner, node.attr, node.lineno)
        elif owner is None and is_private(node.attr):
            held = getattr(node.value, "id", None)
            if held in taken:
                wrong.append(f"{name}:{node.lineno} uses {held}.{node.attr}, private to a "
                             "lower layer")
            elif (held not in ("self", "cls") and node.attr not in surface.private[str(layer)]
                  and any(node.attr in surface.private[low] for low in below)):
                wrong.append(f"{name}:{node.lineno} uses .{node.attr}, an attribute private "
                             "to a lower layer")
    return wrong


@pytest.mark.parametrize("layer", ["walj.journal", "walj.integrations", "walj.archive", "walj.cli"])
def test_every_layer_reaches_a_lower_one_only_through_declared_names(layer: str) -> None:
    surface = Surface.of_the_package()
    wrong = [line for name in sorted(surface.trees) if layer_of(name) == layer
             for line in crossings(name, surface)]
    assert wrong == []


def test_the_layer_surface_check_catches_each_way_around_a_declared_name() -> None:
    """The declared-surface check on a made-up package: each line of the bad module reaches a
    lower layer around its declared surface in one way; the good module only through it."""
    bad = [
        "from walj.journal._core import Core",  # a private module
        "from walj.log import Hidden",  # a name the package does not export
        "from walj.log.segment import _inner",  # a private name
        "import walj.log.undeclared",  # a public submodule with no __all__
        "from ..journal import _core",  # a private module, relative
        "from walj.journal import ToolJournal; ToolJournal._open",  # private attr of a name
        "def f(journal): return journal._state",  # an attribute only the journal defines
        "walj.journal._core.Core",  # a private module reached as an attribute
        "import walj; walj._private",  # a private name of the top package
        "from walj.log import segment; segment._inner",  # a private name of a submodule
        "from walj.log import segment as seg; seg.hidden",  # not in the submodule's __all__
        "walj.log.Hidden",  # not in the package's __all__
        "from walj import Hidden",  # not in the top package's __all__
    ]
    good = [
        "import walj", "from walj.journal import ToolJournal", "from walj.log import segment",
        "from walj.log.segment import read_header", "from .. import _codec, errors",
        "from ..errors import WaljError", "from walj.archive._view import open_view",
        "walj.journal.ToolJournal, walj.ToolJournal, walj.__version__, segment.read_header",
        "class Mine:", "    def __init__(self, other): self._lock = other._lock",
        "    def use(self): return self._state, _codec.MAX_DEPTH",
    ]
    sources = {
        "walj": "__all__ = ['ToolJournal', '__version__']\n_private = 1\nHidden = 1",
        "walj.errors": "class WaljError(Exception): pass", "walj._codec": "MAX_DEPTH = 1",
        "walj.log": "__all__ = ['Log']", "walj.log._base": "class Log:\n    _gone = 1",
        "walj.log.segment": "__all__ = ['read_header']\ndef read_header(): pass\n_inner = 1",
        "walj.log.undeclared": "x = 1",
        "walj.journal": "__all__ = ['ToolJournal']",
        "walj.journal._core": ("class Core:\n    __slots__ = ('_state',)\n"
                               "    def __init__(self): self._lock = 1"),
        "walj.journal._turn": "from ..log._base import Log\nfrom ..log import Log",
        "walj.archive": "", "walj.archive._view": "def open_view(): pass",
        "walj.integrations": "", "walj.integrations.bad": "\n".join(bad),
        "walj.integrations.good": "\n".join(good),
    }
    surface = Surface.of(sources, {"walj", "walj.log", "walj.journal", "walj.archive",
                                   "walj.integrations"})
    wrong = crossings("walj.integrations.bad", surface)
    assert {int(w.split(":")[1].split()[0]) for w in wrong} == set(range(1, len(bad) + 1))
    assert crossings("walj.integrations.good", surface) == []
    assert crossings("walj.journal._turn", surface) == [
        "walj.journal._turn:1 imports the private module walj.log._base",
        "walj.journal._turn:1 takes Log from walj.log._base, which does not export it"]
    assert crossings("walj.log.segment", surface) == []  # the log has no layer below it


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
