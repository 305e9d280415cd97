"""The oldest declared core dependencies (numpy 1.26): no function of numpy 2.x reached on the raw ``numpy`` module.

pyproject.toml accepts ``numpy>=1.26``; CI runs the newest numpy only. numpy 2.0 - 2.2 added the array API's names
to the ``numpy`` module itself (``concat``, ``cumulative_sum``, ``astype``, ...): code that calls them on ``np``, or
passes ``np`` where an array namespace is expected and then calls them on it, works under CI and raises
AttributeError on numpy 1.26 (block verification's exact path weights did, past the float range). Three checks:

* static: no ``np.<name>`` in otspec for a name that numpy 1.26 lacks (:data:`NUMPY2_ONLY`, the difference of
  ``dir(numpy)`` between numpy 1.26.4 and 2.4), nor a keyword numpy 1.26 does not take;
* static: the raw ``numpy`` module is handed over as an array namespace only where the callee's numpy branch
  is written for numpy itself (:data:`RAW_NUMPY_NAMESPACE`); elsewhere array-api-compat's namespace
  (:func:`otspec._array.namespace`) supplies the standard's names on every numpy;
* at run time, on a numpy-1.26-shaped ``numpy`` (the names of :data:`NUMPY2_ONLY` deleted for the test): block
  verification's path weights past the float range against rationals of the same float64 entries, and the tree
  bound's numpy route, each bit for bit equal to the unpatched call.

Each check fails on the code before the fix: ``_host_rows`` handed ``np`` itself to ``_rows``, which calls
``xp.cumulative_sum``, ``xp.cumulative_prod`` and ``xp.concat`` (the second check names the call, the third raises
AttributeError). The whole suite on the real minimum versions is the job of a side environment (README, "Oldest
versions tested").
"""

from __future__ import annotations

import ast
import functools
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from otspec import _validation_kernel
from otspec.block._weights import BIG_WEIGHT, float_chains, path_weight_rows, path_weights
from otspec.models import MemorylessModel
from otspec.tree import TreeShape, _bound_kernels, bound

PKG = Path(__file__).resolve().parents[1] / "otspec"

#: Public names of the ``numpy`` module in numpy 2.4 that numpy 1.26.4 lacks (``sorted(set(dir(numpy 2.4)) -
#: set(dir(numpy 1.26.4)))``, submodules ``core``, ``f2py``, ``typing`` left out), and of ``numpy.linalg``.
NUMPY2_ONLY = frozenset({
    "acos", "acosh", "asin", "asinh", "astype", "atan", "atan2", "atanh", "bitwise_count", "bitwise_invert",
    "bitwise_left_shift", "bitwise_right_shift", "bool", "concat", "cumulative_prod", "cumulative_sum", "isdtype",
    "long", "matrix_transpose", "matvec", "permute_dims", "pow", "strings", "trapezoid", "ulong", "unique_all",
    "unique_counts", "unique_inverse", "unique_values", "unstack", "vecdot", "vecmat",
})
LINALG2_ONLY = frozenset({"cross", "diagonal", "matmul", "matrix_norm", "matrix_transpose", "outer", "svdvals",
                          "tensordot", "trace", "vecdot", "vector_norm"})

#: Keywords of numpy functions that numpy 1.26 does not take (``device=`` on the creation functions, ``copy=`` on
#: ``asarray`` and ``reshape``, ``stable=`` / ``descending=`` on the sorts, ``sorted=`` on ``unique``, the array
#: API's ``min=`` / ``max=`` on ``clip``, ``shape=`` on ``reshape``).
NUMPY2_KEYWORDS = {
    **{f: {"device"} for f in ("arange", "linspace", "zeros", "ones", "empty", "full", "eye", "zeros_like",
                               "ones_like", "empty_like", "full_like", "array", "from_dlpack")},
    "asarray": {"copy", "device"}, "reshape": {"copy", "shape"}, "sort": {"stable", "descending"},
    "argsort": {"stable", "descending"}, "unique": {"sorted"}, "clip": {"min", "max"},
}

#: ``(module, function)``: where otspec hands the raw ``numpy`` module over as an array namespace, each callee's
#: numpy branch written for numpy itself (``if xp is np`` or numpy functions of 1.26 only). Anything else takes
#: :func:`otspec._array.namespace`.
RAW_NUMPY_NAMESPACE = {
    ("tree/_bound.py", "_xp"),            # the tree bound's host route: numpy itself, branches on `xp is np`
    ("tree/_bound.py", "_top_per_row"),
    ("tree/_bound.py", "_order_key"),
    ("tree/_bound.py", "_key_edges"),
    ("tree/_bound_union.py", "_DrawLaws"),
    ("profile/_quantities.py", "_accepted_mass"),  # the host fix of k-Seq rows: expm1, log1p, clip, numpy's own names
    ("profile/_quantities.py", "_kseq_value"),     # the same rows' values: where, clip
}


@functools.cache
def _modules() -> tuple:
    """``(path under otspec/, every node of its syntax tree)`` per module, parsed and walked once for both checks."""
    return tuple((path.relative_to(PKG).as_posix(), tuple(ast.walk(ast.parse(path.read_text()))))
                 for path in sorted(PKG.rglob("*.py")))


def _is_numpy(node) -> bool:
    return isinstance(node, ast.Name) and node.id in ("np", "numpy")


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "?")


def test_no_numpy2_only_function_or_keyword_on_the_numpy_module():
    """``np.concat(...)``, ``np.linalg.vector_norm``, ``np.asarray(x, copy=False)``: each raises on numpy 1.26."""
    bad = []
    for name, nodes in _modules():
        for node in nodes:
            if isinstance(node, ast.Attribute) and _is_numpy(node.value) and node.attr in NUMPY2_ONLY:
                bad.append(f"{name}:{node.lineno} np.{node.attr}")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "linalg"
                    and _is_numpy(node.value.value) and node.attr in LINALG2_ONLY):
                bad.append(f"{name}:{node.lineno} np.linalg.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_numpy(node.func.value):
                late = {k.arg for k in node.keywords} & NUMPY2_KEYWORDS.get(node.func.attr, set())
                if late:
                    bad.append(f"{name}:{node.lineno} np.{node.func.attr}({', '.join(sorted(late))}=...)")
    assert not bad, f"numpy >= 2 only, AttributeError or TypeError on numpy 1.26 (declared minimum): {bad}"


def test_raw_numpy_is_a_namespace_only_where_its_branch_is_written_for_it():
    """``f(..., np)``, ``xp=np`` as a default, ``np if ... else ...``: only the audited places; the code before the
    fix fails here with ``block/_weights.py ... _rows`` (it handed ``np`` to code that calls
    ``xp.cumulative_sum``)."""
    found = set()
    for name, nodes in _modules():
        for node in nodes:
            if isinstance(node, ast.Call):
                if any(_is_numpy(a) for a in list(node.args) + [k.value for k in node.keywords]):
                    found.add((name, _callee(node)))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(_is_numpy(d) for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]):
                    found.add((name, node.name))
                for sub in ast.walk(node):
                    if isinstance(sub, ast.IfExp) and (_is_numpy(sub.body) or _is_numpy(sub.orelse)):
                        found.add((name, node.name))
                    if isinstance(sub, ast.Return) and _is_numpy(sub.value):
                        found.add((name, node.name))
    assert found <= RAW_NUMPY_NAMESPACE, f"raw numpy as an array namespace: {sorted(found - RAW_NUMPY_NAMESPACE)}"


def _hide_numpy2(monkeypatch):
    """The ``numpy`` module shaped as numpy 1.26's until ``monkeypatch.undo()``: without the names numpy 1.26 lacks
    (but ``bool``, which numpy 2's own functions read; the static check covers it), its functions refusing the
    keywords numpy 1.26 does not take (TypeError, as there). array-api-compat's numpy namespace, imported by otspec
    before, keeps its own references."""
    for module, names in ((np, NUMPY2_ONLY - {"bool"}), (np.linalg, LINALG2_ONLY)):
        for name in names & set(vars(module)):  # vars: numpy 1.26's __getattr__ warns on `long`
            monkeypatch.delattr(module, name)
    for name, late in NUMPY2_KEYWORDS.items():
        monkeypatch.setattr(np, name, _refusing(getattr(np, name), late))
    assert not hasattr(np, "cumulative_sum") and not hasattr(np, "concat")


def _refusing(f, late):
    def numpy_126(*args, **kwargs):
        if set(kwargs) & late:
            raise TypeError(f"{f.__name__}() got an unexpected keyword argument {sorted(set(kwargs) & late)[0]!r}")
        return f(*args, **kwargs)

    return numpy_126


# rows of (draft, target) probabilities of the drafted tokens: overflow then back (5e199 squared), underflow then
# back, a subnormal draft probability (the ratio overflows in one division: BIG_WEIGHT), a zero ratio after a large
# one, a row that stays normal (kept bit for bit)
_PX = np.array([[1e-200, 1e-200, 0.5, 0.5], [0.5, 0.5, 1e-200, 1e-200], [5e-324, 0.5, 0.5, 0.5],
                [1e-200, 0.5, 0.25, 0.5], [0.5, 0.25, 0.125, 0.5]])
_QX = np.array([[0.5, 0.5, 1e-300, 0.5], [0.5e-200, 0.5e-200, 0.5, 0.5], [0.5, 0.5, 0.25, 0.5],
                [0.5, 0.0, 0.5, 0.5], [0.25, 0.5, 0.5, 0.5]])


def _rows(px, qx):
    """:func:`path_weight_rows` of the rows with the caller's float chains (those of :func:`float_chains`)."""
    chains = [float_chains(a, b) for a, b in zip(px.tolist(), qx.tolist())]
    w, pw = np.array([c[0][1:] for c in chains]), np.array([c[1][1:] for c in chains])
    return [a.tolist() for a in path_weight_rows(px, qx, np, lambda: (w, pw), onestep=True)]


def _exact(px, qx):
    """The weights and the one-step chain in rationals of the same float64 entries (the definition, independent of
    the code under test): two ``(R, L)`` lists of Fractions."""
    ws, ps = [], []
    for a, b in zip(px.tolist(), qx.tolist()):
        W = P = Fraction(1)
        w, p = [], []
        for s, t in zip(a, b):
            r = Fraction(t) / Fraction(s) if s > 0 else Fraction(1)
            W, P = W * r, min(P * r, Fraction(1))
            w.append(W)
            p.append(P)
        ws.append(w)
        ps.append(p)
    return ws, ps


def _rounded(x: Fraction) -> float:
    """``x`` rounded once, a value above ``BIG_WEIGHT`` standing for it (the one-path helper's rule)."""
    return BIG_WEIGHT if x > BIG_WEIGHT else float(x)


def test_block_path_weights_past_the_range_on_numpy_126(monkeypatch):
    """The numpy route of :func:`path_weight_rows` recomputes these rows' chains: on numpy 1.26 (here: numpy with
    those names hidden) it raised AttributeError (``np.cumulative_sum``) before the fix. Its values are the same
    bits as on the full numpy, each within ``4 (L + 2)`` roundings of the rational value (its documented accuracy;
    a value above ``BIG_WEIGHT`` is ``BIG_WEIGHT``, a subnormal one within the least subnormal); the one-path
    :func:`path_weights` gives the rational values rounded once."""
    full = _rows(_PX, _QX)
    _hide_numpy2(monkeypatch)
    assert _rows(_PX, _QX) == full
    monkeypatch.undo()
    L = _PX.shape[1]
    for chain, exact in zip(full, _exact(_PX, _QX)):
        for got_row, exact_row in zip(chain, exact):
            for got, x in zip(got_row, exact_row):
                want = _rounded(x)
                assert got == want or (want != BIG_WEIGHT and abs(got - want) <= 4 * (L + 2) * 2.0**-52 * want
                                       + 2.0**-1074), (got, want)
    ws, ps = _exact(_PX, _QX)
    for r in range(len(_PX)):
        w, p = path_weights(_PX[r], _QX[r])
        assert (w[1:], p[1:]) == ([_rounded(x) for x in ws[r]], [float(x) for x in ps[r]])


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_tree_bound_numpy_route_on_numpy_126(process, compiled, monkeypatch):
    """The tree bound's host route hands numpy itself around as its namespace (:data:`RAW_NUMPY_NAMESPACE`): on a
    numpy-1.26-shaped numpy it runs and returns the same bits as on the full numpy, with numba's kernels and
    without them (the ``fast`` extra is optional: its absence takes the array route, where
    ``xp.asarray(P, copy=True)`` with ``xp = np`` raised TypeError on numpy 1.26)."""
    if not compiled:
        for module, name in ((_bound_kernels, "JIT"), (_bound_kernels, "RACE_JIT"), (_validation_kernel, "JIT")):
            monkeypatch.setattr(module, name, False)
    p, q = MemorylessModel([0.5, 0.25, 0.125, 0.125]), MemorylessModel([0.125, 0.375, 0.25, 0.25])
    shape = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    full = bound(shape, p, q, process=process)
    _hide_numpy2(monkeypatch)
    shaped = bound(shape, p, q, process=process)
    assert (shaped.value, shaped.pi_exact, shaped.complete) == (full.value, full.pi_exact, full.complete)
