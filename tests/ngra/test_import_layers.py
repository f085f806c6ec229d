"""No import cycles: ngra's packages form layers, each importing only the layers before it.

The import graph is read from the source with ``ast``: every ``import`` statement counts,
those inside functions too (a lazy import is still a dependency; it only hides the cycle
until the function runs). Only ``if TYPE_CHECKING:`` blocks are skipped: they never run.
A unit is a subpackage or a top-level module of ``ngra`` (``ngra.compiler``,
``ngra.saga``, ...; ``ngra`` itself is the package's ``__init__``, the public facade).

A new package is checked as soon as its folder exists: the cycle test covers every unit
found, and the layer test asks for its place in :data:`LAYERS`.

Two more rules keep the layers honest: no private name (a ``_name`` module or object)
crosses from one unit to another (make it public, or move it where it belongs), and an
import inside a function of a unit that the layer order allows at module level is made at
module level, unless its line says why it waits (``# lazy: <reason>``, e.g. numba loading
with the first kernel call rather than at ``import ngra``).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Every unit in dependency order: a unit may import only units listed before it. To add a
#: package, insert it after everything it imports and before everything that imports it.
#: Units whose folder does not exist (yet) are skipped.
LAYERS = (
    "ngra.errors",  # the exception types everything raises; imports nothing of ngra
    "ngra.settings",  # the NGRA_* environment variables, read at use (stdlib only)
    "ngra.diskspace",  # space reserved before writes, killed writers' leftovers (stdlib)
    "ngra.compat",
    "ngra.memstat",
    "ngra.mapped",  # memory-mapped arrays: pages dropped once read, scratch files (numpy)
    "ngra.calibration",  # where measured machine figures are cached (stdlib only)
    "ngra.livetensors",  # live tensor bytes of a step (torch only)
    "ngra.spill",  # saved activations on disk (ngra.memstat only)
    "ngra.idtype",  # index dtypes (32-bit ids where they fit); imports nothing of ngra
    "ngra.probes",
    "ngra.kernels",  # the kernels take index tensors, never a Graph
    "ngra.graph",  # builds its reverse CSR with kernels.transpose_csc
    "ngra.edge",
    "ngra.partition",
    "ngra.datasets",
    "ngra.compiler",
    "ngra.runtime",
    "ngra.saga",
    "ngra",  # the package's __init__: the public names (Graph, SagaLayer, explain, ...)
    "ngra.models",
    "ngra.metrics",  # link-prediction metrics (OGB Hits@K, MRR; ROC-AUC): torch only
    "ngra.distributed",  # ranks: partitioned graphs (the runtime's Partitioned), their loop
    "ngra.planner",  # uses the link model; the compiler hands it dense stages
    "ngra.training",  # a run: config, model source, data, loop, ranks, checkpoints, predict
    "ngra.characterize",
    "ngra.cli",
    "ngra.__main__",
)


def _package_dirs(root: Path) -> dict[str, Path]:
    """``{package: folder}`` from pyproject's ``[tool.setuptools.package-dir]``."""
    text = (root / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return {m[1]: root / m[2] for m in re.finditer(r'^"([\w.]+)"\s*=\s*"([^"]+)"', section, re.M)}


@functools.lru_cache
def _modules(root: Path = ROOT) -> dict[str, Path]:
    """Every ngra module name and its file (a mapped folder wins over ``ngra/``'s own)."""
    out: dict[str, Path] = {}
    for pkg, folder in sorted(_package_dirs(root).items(), key=lambda kv: kv[0].count(".")):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = path
    return out


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that can run (not under ``if TYPE_CHECKING:``)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


@functools.lru_cache
def _import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """``{module: {imported ngra module: line}}``."""
    modules = _modules(root)
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # `from pkg import sub` imports the module pkg.sub when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for target in targets:
                if target.split(".")[0] == "ngra" and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _one_cycle(graph: dict[str, dict[str, int]], modules: dict[str, Path], component: list[str],
               unit_of=lambda m: m) -> str:
    """A shortest import chain from the component's first member back to it, one hop a line
    (``file:line (module) imports target``)."""
    members, start = set(component), component[0]
    hops = [(a, b, line) for a, targets in graph.items() for b, line in targets.items()
            if unit_of(a) in members and unit_of(b) in members and unit_of(a) != unit_of(b)]
    came: dict[str, tuple[str, str, int] | None] = {start: None}
    frontier, end = [start], None
    while frontier and end is None:
        nxt = []
        for unit in frontier:
            for a, b, line in sorted(hops):
                if unit_of(a) != unit:
                    continue
                if unit_of(b) == start:
                    end = (a, b, line)
                    break
                if unit_of(b) not in came:
                    came[unit_of(b)] = (a, b, line)
                    nxt.append(unit_of(b))
            if end:
                break
        frontier = nxt
    chain = [end]
    while came[unit_of(chain[-1][0])] is not None:
        chain.append(came[unit_of(chain[-1][0])])
    return "\n".join(f"  {modules[a].name}:{line} ({a}) imports {b}" for a, b, line in chain[::-1])


def _module_cycles(root: Path) -> str:
    """The module-level import cycles under ``root``, with the imports that make them."""
    graph, modules = _import_graph(root), _modules(root)
    edges = {a: {b for b in targets if b in modules} for a, targets in graph.items()}
    return "\n".join(f"{' <-> '.join(c)}:\n{_one_cycle(graph, modules, c)}"
                     for c in _cycles(edges))


def _package_cycles(root: Path) -> str:
    """The package-level import cycles under ``root``, with the imports that make them."""
    graph, modules = _import_graph(root), _modules(root)
    edges: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        edges[_unit(a)] |= {_unit(b) for b in targets if _unit(b) != _unit(a)}
    return "\n".join(f"{' <-> '.join(c)}:\n{_one_cycle(graph, modules, c, _unit)}"
                     for c in _cycles(edges))


def test_no_module_imports_itself_back():
    cycles = _module_cycles(ROOT)
    assert not cycles, "import cycles between modules:\n" + cycles


def test_no_package_imports_itself_back():
    cycles = _package_cycles(ROOT)
    assert not cycles, "import cycles between packages:\n" + cycles


def test_every_package_imports_only_earlier_layers():
    graph, modules = _import_graph(), _modules()
    units = {_unit(m) for m in modules}
    unplaced = sorted(units - set(LAYERS))
    assert not unplaced, (
        f"{unplaced} not in LAYERS of {Path(__file__).relative_to(ROOT)}: insert each after "
        "the units it imports and before the units that import it")
    rank = {u: i for i, u in enumerate(LAYERS)}
    upward = [f"  {modules[a].relative_to(ROOT)}:{line} imports {b} (a later layer)"
              for a, targets in sorted(graph.items()) for b, line in sorted(targets.items())
              if rank[_unit(b)] > rank[_unit(a)]]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_packages_import_in_layer_order():
    # (a __main__ module runs its program when imported: it is checked by the layer tests)
    units = [u for u in LAYERS if u in {_unit(m) for m in _modules()}
             and not u.endswith("__main__")]
    code = ("import importlib, sys\n"
            f"for name in {units!r}:\n"
            "    importlib.import_module(name)\n"
            "    print(name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == units


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The graph reader itself: a function-level import and a relative import count,
    a TYPE_CHECKING import does not."""
    pkg = tmp_path / "ngra"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from .one import f\n")
    (pkg / "a" / "one.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ngra.c import T\n"
        "def f():\n    from ngra import b\n")
    (pkg / "b.py").write_text("from ngra.a import f\n")
    (pkg / "c.py").write_text("")
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"ngra" = "ngra"\n')
    graph = _import_graph(tmp_path)
    assert graph["ngra.a.one"] == {"ngra.b": 5}
    assert graph["ngra.a"] == {"ngra.a.one": 1}
    assert _module_cycles(tmp_path).startswith("ngra.a <-> ngra.a.one <-> ngra.b:")
    assert _package_cycles(tmp_path).splitlines() == [
        "ngra.a <-> ngra.b:", "  one.py:5 (ngra.a.one) imports ngra.b",
        "  b.py:1 (ngra.b) imports ngra.a"]
    assert _module_cycles(tmp_path).splitlines()[1:] == [
        "  __init__.py:1 (ngra.a) imports ngra.a.one", "  one.py:5 (ngra.a.one) imports ngra.b",
        "  b.py:1 (ngra.b) imports ngra.a"]


def _imports_by_module(root: Path = ROOT):
    """``(module, path, node, target, name, in_function)`` for every runtime ngra import."""
    modules = _modules(root)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        inner = {id(sub) for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                pairs = [(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, a.name)
                         for a in node.names]
            for target, imported in pairs:
                if target.split(".")[0] == "ngra":
                    yield name, path, node, target, imported, id(node) in inner


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_no_private_name_crosses_a_package():
    bad = [f"  {path.relative_to(ROOT)}:{node.lineno} imports {target}"
           + (f" {imported}" if imported and not target.endswith(imported) else "")
           for name, path, node, target, imported, _ in _imports_by_module()
           if _unit(target) != _unit(name)
           and any(_private(p) for p in target.split(".") + [imported or ""])]
    assert not bad, ("private names imported across packages (make them public or move "
                     "them):\n" + "\n".join(sorted(set(bad))))


def test_no_function_level_import_the_layers_allow_at_module_level():
    rank = {u: i for i, u in enumerate(LAYERS)}
    bad = []
    for name, path, node, target, _, in_function in _imports_by_module():
        if not in_function or _unit(target) == _unit(name):
            continue
        if rank.get(_unit(target), len(LAYERS)) >= rank.get(_unit(name), len(LAYERS)):
            continue  # an upward import: the layer test reports it
        line = path.read_text().splitlines()[node.lineno - 1]
        if "# lazy:" not in line:
            bad.append(f"  {path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not bad, ("imports inside functions that the layer order allows at module level "
                     "(move them up, or say why they wait with '# lazy: <reason>'):\n"
                     + "\n".join(sorted(set(bad))))
