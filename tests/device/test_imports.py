"""The import graph of the shipped packages (torch_neuronx, nki) has no circles.

Built statically (ast), so it sees every module, also those a test run never imports.
An import is *module-level* when it runs while its module is being imported: at the top, or
inside a top-level if/try/with or a class body; one inside a function runs on first call.
Imports under ``if TYPE_CHECKING:`` never run and are ignored. An edge goes to the most specific
module an import names (``from pkg import sub`` is an edge to ``pkg.sub``), not to the packages
above it.

Both kinds of circle are forbidden, and reported separately:
- through module-level imports only: whether it loads depends on which module is imported
  first, and a name read from a half-loaded module fails far from the cause;
- closed by a function-level import: it loads, but the two modules depend on each other, so the
  piece both need lives in the wrong one (move it to a module both import).
A function-level import of a package the module itself lives in (``import torch_neuronx`` for
``__version__`` inside torch_neuronx.compile) is no edge: Python loads a module's packages first.
"""

import ast
import collections
from pathlib import Path

import pytest

_REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
_PACKAGES = ("torch_neuronx", "nki")
# The compiled modules (CMakeLists.txt): leaves of the graph, imported by name like any submodule.
_EXTENSIONS = {"torch_neuronx._C", "nki._core"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the packages: dotted name -> (file, is a package)."""
    out = {}
    for pkg in _PACKAGES:
        for f in (_REPO / pkg).rglob("*.py"):
            parts = list(f.relative_to(_REPO).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def _imports(name: str, path: Path, is_pkg: bool, known) -> list[tuple[str, int, bool]]:
    """(imported module, line, lazy) for each import in one module of the packages."""
    package = name if is_pkg else name.rpartition(".")[0]
    found = []

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]), lazy)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module
                for a in child.names:
                    sub = f"{module}.{a.name}"
                    found.append((sub if sub in known or sub in _EXTENSIONS else module, child.lineno, lazy))
            visit(child, lazy)

    visit(ast.parse(path.read_text(), str(path)), False)
    return [(m, line, lazy) for m, line, lazy in found if m in known and m != name]


def _graph(lazy: bool) -> dict[str, dict[str, int]]:
    """module -> {imported module: line} over module-level imports (and function-level ones if lazy)."""
    known = _modules()
    graph = {n: {} for n in known}
    for name, (path, is_pkg) in known.items():
        for target, line, is_lazy in _imports(name, path, is_pkg, known):
            if is_lazy and name.startswith(target + "."):
                continue  # a package its module lives in is loaded before the module runs
            if lazy or not is_lazy:
                graph[name].setdefault(target, line)
    return graph


def _circles(graph) -> list[list[str]]:
    """One shortest circle per strongly connected component of more than one module."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []

    def strongconnect(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(scc)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    circles = []
    for scc in sccs:
        start = min(scc)
        paths, queue = {start: [start]}, collections.deque([start])
        while queue:  # breadth-first: the first module found with an edge back closes the shortest circle
            v = queue.popleft()
            if start in graph[v]:
                circles.append(paths[v] + [start])
                break
            for w in sorted(graph[v]):
                if w in scc and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
    return circles


def _describe(graph, circle) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}"


def test_graph_sees_the_packages():
    graph = _graph(lazy=True)
    assert "torch_neuronx.compile._backend" in graph and "nki.language" in graph
    assert "nki._trace" in graph["nki._jit"]  # module-level
    assert "torch_neuronx.compile._artifacts" in graph["torch_neuronx.compile._backend"]  # in a function
    assert "torch_neuronx.compile._artifacts" not in _graph(lazy=False)["torch_neuronx.compile._backend"]
    assert "torch_neuronx._C" not in graph["torch_neuronx._multiprocessing"]  # extensions are leaves
    assert not _circles({"a": {"b": 1}, "b": {}})
    assert _circles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "b": 4}}) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize("package", _PACKAGES)
@pytest.mark.parametrize("kind", ["module-level", "function-level"])
def test_no_import_circles(package, kind):
    graph = _graph(lazy=kind == "function-level")
    circles = [c for c in _circles(graph) if c[0].split(".")[0] == package]
    assert not circles, (
        f"import circles in {package}/ through {kind} imports (break one edge: move what both need to a "
        "module both import):\n" + "\n".join(_describe(graph, c) for c in circles))


def test_nki_imports_nothing_of_torch_neuronx():
    """nki is AWS's package: torch_neuronx builds on it, never the other way round (even in a function)."""
    graph = _graph(lazy=True)
    edges = [f"{m} (line {line}) -> {t}" for m, targets in sorted(graph.items()) if m.split(".")[0] == "nki"
             for t, line in targets.items() if t.split(".")[0] == "torch_neuronx"]
    assert not edges, "nki imports torch_neuronx:\n" + "\n".join(edges)
