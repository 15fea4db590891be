"""The package's shape, read from its imports (``ast``, nothing imported): data flows one way, without cycles, and
no module reaches into another's private names.

Families, bottom to top (a module may import its own family and any family below it):
core < stats, tasks < model < windtunnel < analyses, dynamics < kinds < report < run < the command lines.
The report sits below the runner: it reads a run folder and nothing else, while a sweep writes its report as it
goes. Lazy imports inside functions count like the others: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "interp_bayes"
RANKS = {"core": 0, "stats": 1, "tasks": 1, "model": 2, "windtunnel": 3, "analyses": 4, "dynamics": 4, "kinds": 5,
         "report": 6, "run": 7}
TOP = 8  # interp_bayes/__init__ (the re-exporting facade) and the command lines
COMMAND_LINES = {"interp_bayes", "interp_bayes.cli", "interp_bayes.dynamics.cli", "interp_bayes.dynamics.__main__"}


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    defined: set[str] = field(default_factory=set)  # top-level names bound by definitions and assignments
    imported: set[str] = field(default_factory=set)  # top-level names bound by imports
    imports: list[tuple[str, str | None, int]] = field(default_factory=list)  # (module, name or None, line)
    private_uses: list[tuple[str, str, int]] = field(default_factory=list)  # (module, private attribute, line)


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bound(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
        else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _parse(path: Path, name: str, names: set[str]) -> Module:
    mod = Module(name, path, path.name == "__init__.py")
    tree = ast.parse(path.read_text())
    package = mod.name if mod.is_package else mod.name.rsplit(".", 1)[0]
    for node in tree.body:
        mod.defined.update(_bound(node))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mod.imported.update((a.asname or a.name).split(".")[0] for a in node.names)
    aliases: dict[str, str] = {}  # local name -> an interp_bayes module bound to it
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source != "interp_bayes" and not source.startswith("interp_bayes."):
                continue
            for a in node.names:
                sub = f"{source}.{a.name}"
                if sub in names:  # `from package import module`
                    mod.imports.append((sub, None, node.lineno))
                    aliases[a.asname or a.name] = sub
                else:
                    mod.imports.append((source, a.name, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("interp_bayes"):
                    mod.imports.append((a.name, None, node.lineno))
                    if a.asname:
                        aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if _private(node.attr):
                mod.private_uses.append((aliases[node.value.id], node.attr, node.lineno))
    return mod


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def modules() -> dict[str, Module]:
    paths = sorted(PACKAGE.rglob("*.py"))
    names = {_name(p) for p in paths}
    return {m.name: m for m in (_parse(p, _name(p), names) for p in paths)}


def rank(name: str) -> int:
    if name in COMMAND_LINES:
        return TOP
    return RANKS[name.split(".")[1]]


def edges(mods: dict[str, Module]) -> dict[str, set[str]]:
    """module -> the package modules it imports (a name imported from a package counts as that package)."""
    out: dict[str, set[str]] = {}
    for m in mods.values():
        out[m.name] = {target for target, _, _ in m.imports if target in mods and target != m.name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


MODS = modules()


def test_every_module_has_a_family():
    unknown = sorted(n for n in MODS if n not in COMMAND_LINES and n.split(".")[1] not in RANKS)
    assert not unknown, f"modules outside the families {sorted(RANKS)}: {unknown}"


def test_no_upward_import():
    upward = [f"{m.name}:{line} imports {target} ({target.split('.')[1]} is above {m.name.split('.')[1]})"
              for m in MODS.values() for target, _, line in m.imports
              if target in MODS and target != "interp_bayes" and rank(target) > rank(m.name)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    found = cycles(edges(MODS))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_name_across_modules():
    crossing = [f"{m.name}:{line} imports {source}.{name}" for m in MODS.values()
                for source, name, line in m.imports if name and _private(name) and source != m.name]
    crossing += [f"{m.name}:{line} uses {source}.{name}" for m in MODS.values() for source, name, line in m.private_uses]
    assert not crossing, "\n".join(crossing)


def test_names_are_imported_where_they_are_defined():
    """A plain module is not a re-exporting facade: importing a name it only imported hides where it lives (the
    package ``__init__`` files are the facades)."""
    relayed = [f"{m.name}:{line} imports {name} from {source}, which only imports it"
               for m in MODS.values() for source, name, line in m.imports
               if name and source in MODS and not MODS[source].is_package
               and name not in MODS[source].defined and name in MODS[source].imported]
    assert not relayed, "\n".join(relayed)


@pytest.mark.parametrize("source, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_cycle_finder_on_planted_graphs(source, expected):
    assert sorted(cycles(source)) == expected


def test_checks_see_a_planted_violation(tmp_path):
    """The parser finds an upward lazy import, a private import and a private attribute use in planted code."""
    planted = tmp_path / "x.py"
    planted.write_text("def f():\n    from ..kinds.y import _hidden\n    from ..kinds import y\n    return y._z\n")
    mod = _parse(planted, "interp_bayes.core.x", {"interp_bayes.core.x", "interp_bayes.kinds.y"})
    assert mod.imports == [("interp_bayes.kinds.y", "_hidden", 2), ("interp_bayes.kinds.y", None, 3)]
    assert mod.private_uses == [("interp_bayes.kinds.y", "_z", 4)]
    assert rank("interp_bayes.kinds.y") > rank(mod.name)


# tests of the whole project (its command line, docs, packaging, layout, refusals), the rest by the family they test
PROJECT_TESTS = {"test_bench.py", "test_cli.py", "test_docs.py", "test_errors.py", "test_gpu_run.py", "test_layout.py",
                 "test_notebook.py", "test_packaging.py", "test_safety.py", "test_stop.py"}


def test_tests_mirror_the_package_families():
    """A test file sits in the folder of the family it tests (``tests/stats/`` for ``interp_bayes/stats/``), so a
    family's tests are found by its name; only the project-wide tests stay at the top."""
    tests = Path(__file__).resolve().parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in {"data", "__pycache__"}}
    assert folders == set(RANKS), f"test folders {sorted(folders ^ set(RANKS))} do not match the package's families"
    top = {p.name for p in tests.glob("test_*.py")}
    assert top == PROJECT_TESTS, (f"{sorted(top - PROJECT_TESTS)} belong in the folder of the family they test"
                                  if top - PROJECT_TESTS else f"{sorted(PROJECT_TESTS - top)} moved: update PROJECT_TESTS")
