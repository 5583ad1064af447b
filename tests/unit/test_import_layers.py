"""The package's module-level import graph: no cycles, and every import goes down the layers.

Read from the source with ``ast`` (nothing is imported): an edge ``a -> b`` for every module-level
``import``/``from ... import`` in ``a`` naming an ``alpa_pass`` module ``b``, and ``a -> p`` for
each package ``p`` above ``b`` (importing ``b`` runs their ``__init__``); imports inside functions
and ``if TYPE_CHECKING:`` blocks are not module-level. A module's edges to its own packages are
left out (Python imports a package before its modules).
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "python" / "alpa_pass"

# Bottom to top: a module may import modules of its own layer or of lower layers only.
LAYERS = [
    {"alpa_pass._version", "alpa_pass._aliases", "alpa_pass.errors", "alpa_pass._compat", "alpa_pass._core", "alpa_pass._sizes"},
    {"alpa_pass.mesh", "alpa_pass.cost_profile", "alpa_pass.solve", "alpa_pass.trace", "alpa_pass.extract"},
    {"alpa_pass.options", "alpa_pass.plan", "alpa_pass.physical_mesh"},
    {"alpa_pass.emit", "alpa_pass.runtime"},
    {"alpa_pass.driver"},
    {"alpa_pass.pipeline"},
    {"alpa_pass.methods"},
    {"alpa_pass.api", "alpa_pass.plugin", "alpa_pass.tools", "alpa_pass.launch", "alpa_pass.checkpoint",
     "alpa_pass.cluster", "alpa_pass.testing", "alpa_pass.util", "alpa_pass.global_env", "alpa_pass.model"},
]


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("alpa_pass",) + path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    out["alpa_pass._core"] = None  # the compiled extension
    return out


def _top_level(tree: ast.Module):
    """Statements run at import time (descending into top-level if/try, not TYPE_CHECKING)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                stack.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        else:
            yield node


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        if path is not None:
            package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
            for node in _top_level(ast.parse(path.read_text())):
                targets = []
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
                for t in targets:
                    if t.startswith("alpa_pass"):
                        while t not in modules:
                            t = t.rsplit(".", 1)[0]
                        mod_parts = t.split(".")
                        edges.update(".".join(mod_parts[:k]) for k in range(1, len(mod_parts) + 1))
        parts = name.split(".")
        graph[name] = edges - {".".join(parts[:k]) for k in range(1, len(parts) + 1)}
    return graph


def _layer(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        if any(name == m or name.startswith(m + ".") for m in layer):
            return i
    return -1  # the package root itself


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_imports_go_down_the_layers():
    graph = import_graph()
    unplaced = sorted(m for m in graph if m != "alpa_pass" and _layer(m) < 0)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"
    upward = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                    if a != "alpa_pass" and b != "alpa_pass" and _layer(b) > _layer(a))
    assert not upward, upward


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_root_imports_nothing_heavy():
    """``alpa_pass/__init__`` (run by every ``import alpa_pass.plugin``) loads its names lazily."""
    assert import_graph()["alpa_pass"] <= {"alpa_pass._version"}
