"""The package's import graph has no cycle: every import (module level or inside a function) runs downwards.

Subpackages form layers (multidraft, otm below lossy; the verifier registry otspec._registry below all of
them, its entries registered from otspec._catalogue above the families it lists).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "otspec"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


@lru_cache(maxsize=None)
def _parse(text: str) -> ast.Module:
    """A module's syntax tree, parsed once per text for the three checks below (they only read it)."""
    return ast.parse(text)


def _edges(mods) -> dict[str, set[str]]:
    edges = {}
    for name, (f, is_pkg) in mods.items():
        pkg = name if is_pkg else name.rsplit(".", 1)[0]
        out = set()
        for node in ast.walk(_parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                out |= {c for c in [target] + [f"{target}.{a.name}" for a in node.names] if c in mods}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in mods}
        # a module reaching its own package's __init__ (re-exports) is not a dependency between layers
        edges[name] = {b for b in out if b != name and not (mods[b][1] and name.startswith(b + "."))}
    return edges


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _layer(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_import_runs_back_up_between_subpackages():
    edges = _edges(_modules())
    layers: dict[str, set[str]] = {}
    for a, bs in edges.items():
        for b in bs:
            if _layer(a) != _layer(b) and "otspec" not in (_layer(a), _layer(b)):
                layers.setdefault(_layer(a), set()).add(_layer(b))
    assert _cycles(layers) == []
    assert "otspec.lossy" not in {_layer(b) for b in edges["otspec._registry"]}


def test_no_module_cycle():
    # no two modules import each other, directly or through others (function-level imports included)
    assert _cycles(_edges(_modules())) == []


#: Function-level imports of otspec modules that stay, each with the reason (empty: a module's dependencies on the
#: package are all visible at its head).
FUNCTION_LEVEL_ALLOWED: dict[str, str] = {}


def _function_level_imports(mods) -> list[str]:
    """``module:line`` of every import of an otspec module made inside a function or method body."""
    found = []

    def visit(node, name: str, inside: bool) -> None:
        # one walk of the tree, knowing whether a function or method body encloses the node (was: ast.walk of every
        # function, nested ones walked again inside their enclosing ones' walks; the same set of imports)
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if inside and ((isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith(
                "otspec"))) or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "otspec"
                                                                     for a in node.names))):
            found.append(f"{name}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, name, inside)

    for name, (f, _) in mods.items():
        visit(_parse(f.read_text()), name, False)
    return sorted(set(found))


def test_package_imports_at_module_head():
    # a reader sees a module's dependencies from its head; lazy imports are for optional third-party
    # dependencies only (torch, pyarrow, matplotlib, dask)
    found = [x for x in _function_level_imports(_modules()) if x.split(":")[0] not in FUNCTION_LEVEL_ALLOWED]
    assert found == []


def test_function_level_import_check_catches_one(tmp_path):
    # the check above is not vacuous: a planted function-level import is found
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from . import x\n    return x\n")
    assert _function_level_imports({"otspec.m": (f, False)}) == ["otspec.m:2"]
