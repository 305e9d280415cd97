"""The i.i.d. bound with laws given (``next_dist`` models) against the same laws handed over as arrays (task BU).

``otspec.tree.bound`` with ``fresh_laws`` models reads each law where the model returned it
(``_ModelLaws.unchecked``: one prefix tuple per path for both models, read-only views, the pending checks listed in
the check on reading's order) and checks it in the row kernels' pass; ``_sampled`` with a callable that returns the
same rows as lists is the route of laws as arrays (no check). The two must give the same bound:

* bit for bit (value, per-depth sums and lower sums, remainder, prefixes expanded, calls, completeness, exactness)
  and the same prefixes asked in the same order, for i.i.d. shapes (balanced, chains, ragged), ``V`` from 2 to
  3,000, budgets from 1 to every prefix, batches of 1 to 64, laws as separate arrays, as rows of one array and as
  read-only rows;
* bad laws (NaN, ``-0.0``, subnormal, a total off, a negative entry) at the root and below it, in the draft and the
  target: the error type and message of the check on reading (``_ModelLaws.__call__``, main's route), or, where its
  entries are flushed, its bound to the bit.

Each check is shown to fail on a deliberately broken glue (the target's rows out of order, the draft's rows given
for the target's, the prefixes without the context, the target's pending checks dropped, the draft's checked after
the target's).
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

from otspec.tree import TreeShape, bound
from otspec.tree import _bound_kernels as K

B = importlib.import_module("otspec.tree._bound")

pytestmark = pytest.mark.skipif(not K.JIT, reason="the fused row kernels need numba (the fast extra)")


class _Rows:
    """A ``fresh_laws`` model: a seeded law per prefix (softmax of normals, about a fifth of its entries exactly 0
    when ``zeros``), made once and never written again; ``store``: ``"arrays"`` (a new array each),
    ``"base"`` (rows of one ``(n, V)`` array, as a model's tree call gives them) or ``"readonly"`` (rows of one
    read-only array); ``bad(prefix, row)`` may change a row when it is made. Records the prefixes asked."""

    fresh_laws = True

    def __init__(self, V: int, seed: int, *, store: str = "base", zeros: bool = True, bad=None):
        self.vocab_size, self.seed, self.store, self.zeros, self.bad = V, seed, store, zeros, bad
        self.d: dict = {}
        self.asked: list = []
        self.base = np.empty((4096, V))

    def next_dist(self, prefix):
        self.asked.append(prefix)
        prefix = tuple(prefix)
        if prefix not in self.d:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            z = rng.normal(0.0, 3.0, self.vocab_size)
            x = np.exp(z - z.max())
            if self.zeros and self.vocab_size > 2:
                x[rng.random(self.vocab_size) < 0.2] = 0.0
                x[int(np.argmax(z))] = 1.0
            x /= x.sum()
            if self.bad is not None:
                x = self.bad(prefix, x)
            if self.store != "arrays":
                self.base[len(self.d)] = x
                x = self.base[len(self.d)]
                if self.store == "readonly":
                    x = x.view()
                    x.flags.writeable = False
            self.d[prefix] = x
        return self.d[prefix]


class _Arrays:
    """Laws as arrays: ``laws(paths) -> (P rows, Q rows)``, the models' own rows as lists (no check, no copy), and
    the paths of each call."""

    def __init__(self, draft, target, ctx=()):
        self.models, self.ctx = (draft, target), tuple(ctx)
        self.calls = 0
        self.asked: list = []

    def __call__(self, paths):
        self.calls += 1
        self.asked.append([tuple(s) for s in paths])
        return tuple([m.next_dist(self.ctx + tuple(s)) for s in paths] for m in self.models)


def _same(a, b) -> bool:
    fa, fb = dataclasses.asdict(a), dataclasses.asdict(b)
    return fa.keys() == fb.keys() and all(
        fa[k].tobytes() == fb[k].tobytes() and fa[k].shape == fb[k].shape if isinstance(fa[k], np.ndarray)
        else fa[k] == fb[k] for k in fa)


SHAPES = {
    "b322": TreeShape.branching(3, 2, 2),
    "b87": TreeShape.branching(8, 7),
    "chain3": TreeShape.chains(1, 3),
    "b2": TreeShape.branching(2),
    "ragged": TreeShape([(0,), (3,), (0, 0), (0, 2), (3, 1), (0, 0, 0), (0, 2, 1)]),
    "ragged2": TreeShape([(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 1), (1, 0)]),
}


def _pair(V, store="base", bad_p=None, bad_q=None):
    return _Rows(V, 1, store=store, bad=bad_p), _Rows(V, 2, store=store, bad=bad_q)


def _given_vs_arrays(shape, V, budget, batch, store="base", ctx=(5,)) -> list:
    """The differences between the bound with laws given and with the same laws as arrays (empty: none)."""
    md, mt = _pair(V, store)
    a = bound(shape, md, mt, process="iid", prefix=ctx if V > 5 else (), budget=budget, batch=batch)
    ad, at = _pair(V, store)
    laws = _Arrays(ad, at, ctx if V > 5 else ())
    b = B._sampled(B._Slots(shape), "iid", laws, budget, batch)
    out = []
    if not _same(a, b):
        out.append(("fields", a, b))
    asked = [s for call in laws.asked for s in call]
    c = len(ctx) if V > 5 else 0
    if [tuple(s)[c:] for s in md.asked] != asked or [tuple(s)[c:] for s in mt.asked] != asked:
        out.append(("prefixes", len(md.asked), len(asked)))
    if a.n_calls != len(laws.asked):
        out.append(("calls", a.n_calls, len(laws.asked)))
    return out


#: (shape, V, budget, batch): budgets from 1 to every prefix (complete), small and large batches.
CASES = [
    ("b322", 2, 1, 1), ("b322", 2, 100_000, 4), ("b322", 3, 7, 2), ("b322", 7, 40, 16), ("b322", 300, 40, 16),
    ("b322", 3000, 24, 8), ("b87", 2, 100_000, 64), ("b87", 40, 60, 16), ("b87", 3000, 20, 19),
    ("chain3", 2, 100_000, 1), ("chain3", 300, 9, 3), ("b2", 3, 1, 64), ("b2", 3000, 2, 1),
    ("ragged", 4, 100_000, 8), ("ragged", 300, 30, 7), ("ragged", 3000, 12, 5), ("ragged2", 3, 100_000, 3),
    ("ragged2", 700, 40, 8),
]


@pytest.mark.parametrize("store", ["base", "arrays", "readonly"])
@pytest.mark.parametrize("shape,V,budget,batch", CASES)
def test_laws_given_are_laws_as_arrays_bit_for_bit(shape, V, budget, batch, store):
    """Laws given against the same rows as arrays: every field of the bound to the bit, the same prefixes asked in
    the same order, the same calls."""
    assert _given_vs_arrays(SHAPES[shape], V, budget, batch, store) == []


def test_the_complete_bound_is_reached():
    """A budget of every prefix is complete on a small vocabulary (the cases above reach the complete bound)."""
    md, mt = _pair(3)
    assert bound(SHAPES["ragged2"], md, mt, process="iid", budget=100_000, batch=3).complete


def test_unchecked_hands_the_rows_where_they_are():
    """The glue: both models asked at ``ctx + path``, in order; rows returned read-only and sharing the models'
    memory (writeable ones as views, the model's array untouched); pending checks draft first, then target, in
    row order; a law that is not a C-contiguous float64 row of ``V`` is checked on reading (a copy)."""
    V = 50
    md, mt = _Rows(V, 1, store="base"), _Rows(V, 2, store="readonly")
    laws = B._ModelLaws(md, mt, V, (7, 8))
    paths = [(), (3,), (3, 4)]
    P, Q, pending = laws.unchecked(paths)
    assert md.asked == mt.asked == [(7, 8), (7, 8, 3), (7, 8, 3, 4)]
    for rows, m in ((P, md), (Q, mt)):
        for r, s in zip(rows, paths):
            g = m.d[(7, 8) + s]
            assert np.shares_memory(r, g) and not r.flags.writeable and r.tobytes() == g.tobytes()
    assert all(md.d[k].flags.writeable for k in md.d)
    assert [(k, i) for k, i, _r in pending.entries] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(r is (P, Q)[k][i] or r.base is (P, Q)[k][i].base for k, i, r in pending.entries)
    assert pending.resolve(None) == {} and pending.entries == []

    class Strided(_Rows):
        def next_dist(self, prefix):
            x = super().next_dist(prefix)
            y = np.zeros(2 * V)
            y[::2] = x
            return y[::2]                   # not contiguous: checked on reading, copied into the call's block

    ms = Strided(V, 3, store="arrays")
    P, Q, pending = B._ModelLaws(ms, mt, V, ()).unchecked([(), (1,)])
    assert [(k, i) for k, i, _r in pending.entries] == [(1, 0), (1, 1)]
    assert all(not np.shares_memory(r, ms.d[s]) and r.tobytes() == ms.d[s].tobytes() for r, s in zip(P, [(), (1,)]))


def _moved(value):
    def f(x):
        y = x.copy()
        k = int(np.argmax(y))
        j = (k + 1) % y.shape[0]
        y[k] += y[j]
        y[j] = value
        return y
    return f


def _set(value):
    def f(x):
        y = x.copy()
        y[int(np.argmax(y))] = value
        return y
    return f


def _negative(x):
    y = x.copy()
    k = int(np.argmax(y))
    j = (k + 1) % y.shape[0]
    y[k] += y[j] + 1e-3
    y[j] = -1e-3
    return y


#: Bad laws: (name, change of a row, whether the check on reading refuses it).
BAD = [
    ("nan", _set(np.nan), True),
    ("minus-zero", _moved(-0.0), False),
    ("subnormal", _moved(5e-324), False),
    ("total-off", lambda x: x * 1.01, True),
    ("negative", _negative, True),
]


def _where(change, at):
    if at == "root":
        return lambda prefix, x: change(x) if len(prefix) == 0 else x
    return lambda prefix, x: change(x) if len(prefix) == 1 and prefix[0] % 3 == 1 else x


def _bad_outcomes(change, at, model, store, V=300) -> tuple:
    """``(laws given, checked on reading)``: each the bound or the exception, on ``branching(3,2,2)``."""
    bad = _where(change, at)
    out = []
    for fused in (True, False):
        kw = dict(bad_p=bad) if model == "draft" else dict(bad_q=bad)
        md, mt = _pair(V, store, **kw)
        with pytest.MonkeyPatch.context() as mp:
            if not fused:                                  # main's check on reading
                mp.setattr(B._ModelLaws, "unchecked", lambda self, paths: (*self(paths), None))
            try:
                out.append(bound(SHAPES["b322"], md, mt, process="iid", budget=40, batch=8))
            except (ValueError, TypeError) as e:
                out.append(e)
    return tuple(out)


def _bad_mismatch(kind, change, refused, at, model, store) -> str | None:
    a, b = _bad_outcomes(change, at, model, store)
    if refused:
        if not isinstance(b, ValueError):
            return f"not refused on reading: {b!r}"
        if type(a) is not type(b) or str(a) != str(b):
            return f"{a!r} != {b!r}"
        if f"{model}.next_dist(" not in str(a):
            return f"the message names another law: {a}"
        return None
    if isinstance(a, Exception) or isinstance(b, Exception) or not _same(a, b):
        return f"{a!r} != {b!r}"
    return None


@pytest.mark.parametrize("store", ["base", "arrays"])
@pytest.mark.parametrize("at", ["root", "deep"])
@pytest.mark.parametrize("model", ["draft", "target"])
@pytest.mark.parametrize("kind,change,refused", BAD, ids=[b[0] for b in BAD])
def test_bad_laws_are_refused_with_mains_message(kind, change, refused, at, model, store):
    """A bad law in the draft or the target, at the root or below it: the error and message of the check on
    reading, or (entries flushed) its bound to the bit."""
    assert _bad_mismatch(kind, change, refused, at, model, store) is None


def test_the_first_bad_law_is_the_draft_s():
    """Bad laws in the draft and the target of one call: the draft's is reported, as the check on reading does."""
    bad = _where(_set(np.nan), "deep")
    md, mt = _pair(300, "base", bad_p=_where(lambda x: x * 1.5, "deep"), bad_q=bad)
    with pytest.raises(ValueError, match=r"draft\.next_dist\("):
        bound(SHAPES["b322"], md, mt, process="iid", budget=40, batch=8)


# ------------------------------------------------------------------ the checks above fail on a broken glue
def _rotate_target(orig):
    def unchecked(self, paths):
        P, Q, pending = orig(self, paths)
        return P, Q[1:] + Q[:1], pending
    return unchecked


def _draft_for_target(orig):
    def unchecked(self, paths):
        P, Q, pending = orig(self, paths)
        return P, list(P), pending
    return unchecked


def _no_context(orig):
    def unchecked(self, paths):
        ctx, self.ctx = self.ctx, ()
        try:
            return orig(self, paths)
        finally:
            self.ctx = ctx
    return unchecked


def _target_unchecked(orig):
    def unchecked(self, paths):
        P, Q, pending = orig(self, paths)
        if pending is not None:
            pending.entries = [e for e in pending.entries if e[0] == 0]
        return P, Q, pending
    return unchecked


def _target_first(orig):
    def unchecked(self, paths):
        P, Q, pending = orig(self, paths)
        if pending is not None:
            pending.entries = [e for e in pending.entries if e[0] == 1] + [e for e in pending.entries if e[0] == 0]
        return P, Q, pending
    return unchecked


@pytest.mark.parametrize("broken", [_rotate_target, _draft_for_target, _no_context])
def test_the_bit_for_bit_check_catches_a_broken_glue(broken, monkeypatch):
    """The comparison above finds a difference where the glue hands the wrong rows or asks the wrong prefixes."""
    monkeypatch.setattr(B._ModelLaws, "unchecked", broken(B._ModelLaws.unchecked))
    found = [_given_vs_arrays(SHAPES[s], V, budget, batch) for s, V, budget, batch in
             (("b322", 300, 40, 16), ("ragged", 300, 30, 7), ("b87", 40, 60, 16))]
    assert any(found)


def test_the_bad_law_check_catches_a_broken_glue(monkeypatch):
    """The comparison above finds a difference where the target's laws are not checked (a bad law accepted)."""
    monkeypatch.setattr(B._ModelLaws, "unchecked", _target_unchecked(B._ModelLaws.unchecked))
    assert _bad_mismatch("nan", _set(np.nan), True, "deep", "target", "base") is not None
    assert _bad_mismatch("total-off", lambda x: x * 1.01, True, "root", "target", "arrays") is not None


def test_the_first_bad_law_check_catches_a_broken_order(monkeypatch):
    """The draft's laws resolved after the target's: the target's error is reported, and the test above fails."""
    monkeypatch.setattr(B._ModelLaws, "unchecked", _target_first(B._ModelLaws.unchecked))
    bad = _where(_set(np.nan), "deep")
    md, mt = _pair(300, "base", bad_p=_where(lambda x: x * 1.5, "deep"), bad_q=bad)
    with pytest.raises(ValueError, match=r"target\.next_dist\("):
        bound(SHAPES["b322"], md, mt, process="iid", budget=40, batch=8)
