"""The laws of ``fresh_laws`` models checked in the bound's row kernels' own pass (task BO).

``otspec.tree._bound._ModelLaws.unchecked`` returns the laws read in place unchecked; the row kernels
(``iid_rows``/``iid_row``/``iid_row_sums``, and without replacement at the last depth ``wor_row_last`` through
``wor_rows_decide``/``wor_row_decide``) sum both rows and count their bad entries in the same pass
(``check_block``/``check_finish``), and ``_Unchecked.resolve`` accepts a row where its total passes
``law_in_place``'s test, else checks it apart exactly as the check on reading does.

* The fused route against the route that checks each law on reading (``_ModelLaws.__call__``, the code before),
  bit for bit: value, per-depth sums, remainder, prefixes expanded, calls, for i.i.d. and without replacement,
  ``V`` from 2 to 3,000 and the benchmark's shape and budget at a reduced ``V``; laws returned as separate arrays
  (one kernel call per row) and as rows of one array (one call per array); and the fused route taken (every good
  law accepted from the kernels' totals, none checked apart).
* Every kind of bad law (NaN, inf, negative, a negative entry the total does not see, ``-0.0``, subnormal, a total
  off by more than the tolerance, just inside and just outside it), in the draft and in the target, at the root
  and at the frontiers below it: the same exception and message as the check on reading (or, for the laws whose
  entries are flushed, the same bound to the bit).
* Broken kernels (their Python source with the check's lines changed, run as Python) and a broken glue (every
  total accepted): the tests above fail.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types

import numpy as np
import pytest

from otspec._validation import SIMPLEX_TOL
from otspec.tree import TreeShape, bound
from otspec.tree import _bound_kernels as K

B = importlib.import_module("otspec.tree._bound")

pytestmark = pytest.mark.skipif(not K.JIT, reason="the fused check needs numba (the fast extra)")


class _Laws:
    """A ``fresh_laws`` model: a seeded softmax law per prefix, made once and never written again (separate arrays,
    or with ``base`` rows of one ``(n, V)`` array, as a model's tree call gives them); ``bad(prefix, row)`` may
    change a row when it is made."""

    fresh_laws = True

    def __init__(self, V: int, seed: int, *, base: bool = False, bad=None):
        self.vocab_size, self.seed, self.bad = V, seed, bad
        self.d: dict = {}
        self.calls = 0
        self.store = np.empty((4096, V)) if base else None

    def next_dist(self, prefix):
        self.calls += 1
        prefix = tuple(prefix)
        if prefix not in self.d:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            z = rng.normal(0.0, 3.0, self.vocab_size)
            x = np.exp(z - z.max())
            x /= x.sum()
            if self.bad is not None:
                x = self.bad(prefix, x)
            if self.store is not None:
                self.store[len(self.d)] = x
                x = self.store[len(self.d)]
            self.d[prefix] = x
        return self.d[prefix]


def _fields(r) -> dict:
    return dataclasses.asdict(r)


def _same(a, b) -> bool:
    fa, fb = _fields(a), _fields(b)
    return fa.keys() == fb.keys() and all(
        np.array_equal(fa[k], fb[k]) if isinstance(fa[k], np.ndarray) else fa[k] == fb[k] for k in fa)


def _run(V, shape, process, *, fused: bool, base=False, bad_p=None, bad_q=None, budget=64, batch=16,
         monkeypatch=None, record=None):
    """``(bound or the exception, draft calls, target calls)``: by the fused route, or (``fused=False``) with every
    law checked on reading (``_ModelLaws.__call__``, the code before)."""
    p, q = _Laws(V, 1, base=base, bad=bad_p), _Laws(V, 2, base=base, bad=bad_q)
    with pytest.MonkeyPatch.context() as mp:
        if not fused:
            mp.setattr(B._ModelLaws, "unchecked", lambda self, paths: (*self(paths), None))
        elif record is not None:
            orig = B._Unchecked.resolve

            def resolve(self, chk):
                record.append((chk is not None, len(self.entries), _apart(self, chk)))
                return orig(self, chk)

            mp.setattr(B._Unchecked, "resolve", resolve)
        try:
            got = bound(shape, p, q, process=process, prefix=(1,), budget=budget, batch=batch)
        except (ValueError, TypeError) as e:
            got = e
    return got, p.calls, q.calls


def _apart(pending, chk) -> int:
    """How many of the pending laws ``resolve`` would check apart (their kernels' total not accepted)."""
    if chk is None:
        return len(pending.entries)
    V = pending.laws.V
    return sum(not B.law_total_accepts(float(chk[i, k]), V) for k, i, _row in pending.entries)


SHAPES = {"b87": TreeShape.branching(8, 7), "b322": TreeShape.branching(3, 2, 2), "b2": TreeShape.branching(2)}


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("base", [False, True], ids=["arrays", "rows-of-one-array"])
@pytest.mark.parametrize("V", [2, 3, 9, 300, 3000])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_fused_route_is_the_separate_check_bit_for_bit(process, base, V, shape):
    """The bound by the fused check against the check on reading: every field to the bit, the same calls; and the
    fused route taken: every law's total from the kernels accepted (none checked apart) wherever a kernel checked
    the rows (i.i.d. every frontier; without replacement the frontiers of the last depth)."""
    sh = SHAPES[shape]
    if process == "wor" and max((max(path) for path in sh.paths if path), default=0) + 1 > V:
        pytest.skip("more ranks than tokens")
    record: list = []
    a = _run(V, sh, process, fused=True, base=base, record=record)
    b = _run(V, sh, process, fused=False, base=base)
    assert not isinstance(a[0], Exception), a[0]
    assert _same(a[0], b[0]), (a[0], b[0])
    assert a[1:] == b[1:]
    by_kernel = [r for r in record if r[0]]
    assert all(n == 0 for _k, _m, n in by_kernel), record
    if process == "iid":
        assert by_kernel and len(by_kernel) == len(record), record       # every frontier checked by its kernels
    elif sh.max_depth == 2 and V > 8:
        assert by_kernel, record                                         # the last depth's frontiers


@pytest.mark.slow
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_the_benchmarks_shape_at_a_reduced_vocabulary(process):
    """branching(8, 7), a budget of 256 in calls of 64 prefixes (the benchmark's), at ``V = 2,000``, laws as rows
    of one array and as separate arrays: the fused route is the separate check's bound to the bit."""
    for base in (False, True):
        a = _run(2000, SHAPES["b87"], process, fused=True, base=base, budget=256, batch=64)
        b = _run(2000, SHAPES["b87"], process, fused=False, base=base, budget=256, batch=64)
        assert _same(a[0], b[0]) and a[1:] == b[1:], (process, base)


def _edge(x, over: bool):
    """``x`` scaled to a total just outside (``over``) or just inside the tolerance (numpy's total)."""
    f = 1.0 + SIMPLEX_TOL * (1.0 + 1e-6 if over else 1.0 - 1e-6)
    return x * f


def _neg_hidden(x):
    """A negative entry whose mass is added back elsewhere: the total is 1, only the entry's sign bit tells."""
    y = x.copy()
    k = int(np.argmin(y[1:])) + 1 if y.shape[0] > 1 else 0
    y[k] = -1e-3
    y[0] += 1e-3 + x[k]
    return y


def _moved(value):
    def f(x):
        y = x.copy()
        y[0] += y[-1]
        y[-1] = value
        return y
    return f


def _set(value):
    def f(x):
        y = x.copy()
        y[-1] = value
        return y
    return f


#: Bad laws: (name, change of a row, whether the check on reading refuses it).
BAD = [
    ("nan", _set(np.nan), True),
    ("inf", _set(np.inf), True),
    ("negative", _set(-0.25), True),
    ("negative-hidden", _neg_hidden, True),
    ("minus-zero", _moved(-0.0), False),
    ("subnormal", _moved(5e-324), False),
    ("total-off", lambda x: x * 1.01, True),
    ("edge-outside", lambda x: _edge(x, True), True),
    ("edge-inside", lambda x: _edge(x, False), False),
]


def _where(kind, change, at):
    """The change applied at the root's law (``at="root"``) or at every law below it (``"deep"``)."""
    if at == "root":
        return lambda prefix, x: change(x) if len(prefix) == 1 else x
    return lambda prefix, x: change(x) if len(prefix) > 1 else x


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("at", ["root", "deep"])
@pytest.mark.parametrize("model", ["draft", "target"])
@pytest.mark.parametrize("kind,change,refused", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("base", [False, True], ids=["arrays", "rows-of-one-array"])
def test_bad_laws_get_the_same_error(process, at, model, kind, change, refused, base):
    """A bad law, in the draft or the target, at the root or below it: the fused route raises the check on
    reading's exception, type and message (which names the law), or (entries flushed, totals inside the
    tolerance) gives its bound to the bit."""
    bad = _where(kind, change, at)
    kw = dict(bad_p=bad) if model == "draft" else dict(bad_q=bad)
    a = _run(40, SHAPES["b87"], process, fused=True, base=base, **kw)
    b = _run(40, SHAPES["b87"], process, fused=False, base=base, **kw)
    if refused:
        assert isinstance(b[0], ValueError), (kind, b[0])
        assert type(a[0]) is type(b[0]) and str(a[0]) == str(b[0]), (a[0], b[0])
        assert f"{model}.next_dist(" in str(a[0])
    else:
        assert not isinstance(b[0], Exception), b[0]
        assert not isinstance(a[0], Exception), a[0]
        assert _same(a[0], b[0]) and a[1:] == b[1:]


def test_the_first_bad_law_in_the_check_on_readings_order():
    """Bad laws in the draft at one prefix and in the target at an earlier one: the draft's is reported (the check
    on reading checks every draft law of a call before the target's), and among the target's the first."""
    def bad_p(prefix, x):
        return x * 1.5 if len(prefix) == 2 and prefix[1] % 5 == 4 else x

    def bad_q(prefix, x):
        return _set(np.nan)(x) if len(prefix) == 2 else x

    for process in ("iid", "wor"):
        a = _run(40, SHAPES["b87"], process, fused=True, bad_p=bad_p, bad_q=bad_q)
        b = _run(40, SHAPES["b87"], process, fused=False, bad_p=bad_p, bad_q=bad_q)
        assert str(a[0]) == str(b[0]) and "draft.next_dist(" in str(a[0])
        a = _run(40, SHAPES["b87"], process, fused=True, bad_q=bad_q)
        b = _run(40, SHAPES["b87"], process, fused=False, bad_q=bad_q)
        assert str(a[0]) == str(b[0]) and "target.next_dist(" in str(a[0])


# ------------------------------------------------------------------ the tests above fail on broken checks
_FUSED = ("check_block", "check_finish", "iid_row_sums", "iid_row", "iid_rows", "wor_row_last", "wor_row_decide",
          "wor_rows_decide")


def _broken_kernels(old: str, new: str):
    """The kernel module with ``check_block``'s or ``check_finish``'s line ``old`` replaced by ``new`` and every
    function that calls them run as Python (their sources, with the module's other compiled helpers)."""
    ns = dict(vars(K))
    for name in _FUSED:
        f = getattr(K, name)
        src = inspect.getsource(getattr(f, "py_func", f))
        if name in ("check_block", "check_finish"):
            assert src.count(old) <= 1
            src = src.replace(old, new)
        exec(compile(src, f"<broken {name}>", "exec"), ns)  # noqa: S102 - the test's own copy
    mod = types.ModuleType("broken_kernels")
    mod.__dict__.update(ns)
    return mod


#: Broken checks: (line, replacement, why the tests must catch it).
BROKEN = [
    ("        ck[2 * BLOCK + v] += 1.0 if bad else 0.0", "        ck[2 * BLOCK + v] += 0.0",
     "the bit test skipped"),
    ("        ck[BLOCK + v] += qb[v]", "        ck[BLOCK + v] += pb[v]", "the target's total taken from the draft"),
    ("((bp != 0) & ((bp < TINY_BITS) | (bp >= INF_BITS))) | ", "", "the draft's bits not tested"),
    ("    ok = nb == 0.0", "    ok = True", "the bad entries' count not read"),
]


@pytest.mark.parametrize("old,new,why", BROKEN, ids=[b[2] for b in BROKEN])
def test_the_checks_catch_broken_kernels(old, new, why, monkeypatch):
    """Each broken check lets a bad law through (or refuses none) somewhere in the tests above: the draft's or
    the target's hidden negative entry or total off, by both kernels' routes."""
    src = inspect.getsource(K.check_block.py_func) + inspect.getsource(K.check_finish.py_func)
    assert src.count(old) == 1, why
    monkeypatch.setattr(B, "_K", _broken_kernels(old, new))
    caught = []
    for process in ("iid", "wor"):
        for model in ("draft", "target"):
            for change in (_neg_hidden, lambda x: x * 1.01):
                bad = _where("x", change, "deep")
                kw = dict(bad_p=bad) if model == "draft" else dict(bad_q=bad)
                a = _run(40, SHAPES["b87"], process, fused=True, **kw)
                b = _run(40, SHAPES["b87"], process, fused=False, **kw)
                caught.append(type(a[0]) is not type(b[0]) or str(a[0]) != str(b[0]))
    assert any(caught), why


def test_the_checks_catch_a_glue_that_accepts_every_total(monkeypatch):
    """Every kernel total accepted (the check skipped): a bad law below the root is not refused."""
    monkeypatch.setattr(B, "law_total_accepts", lambda t, n, tol=SIMPLEX_TOL: True)
    a = _run(40, SHAPES["b87"], "iid", fused=True, bad_q=_where("x", _set(np.nan), "deep"))
    b = _run(40, SHAPES["b87"], "iid", fused=False, bad_q=_where("x", _set(np.nan), "deep"))
    assert isinstance(b[0], ValueError) and not isinstance(a[0], ValueError)


def test_the_checks_catch_totals_never_accepted(monkeypatch):
    """No kernel total accepted (every law checked apart, the fused route not taken): the route check of the first
    test fails."""
    monkeypatch.setattr(B, "_K", _broken_kernels("        ck[v] += pb[v]", "        ck[v] += 0.0"))
    record: list = []
    _run(40, SHAPES["b87"], "iid", fused=True, record=record)
    assert any(n for _k, _m, n in record if _k)
