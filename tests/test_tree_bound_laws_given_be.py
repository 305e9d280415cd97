"""The bound with laws from ``next_dist`` models, each law read once (otspec.tree._bound._ModelLaws,
otspec._validation.law_into, otspec._validation_kernel.law_copy_sum).

Independent route: the route before, every law checked by the numpy sum of its flushed copy
(:func:`otspec._validation.validate_distribution` with ``law_into`` turned off) into a memoised cache of fresh rows
(:class:`otspec.tree._process.LawCache`), run through the same search (``_sampled``). Against it, to the bit: the
bound's value, per-depth sums, remainder, flags, the prefixes asked for in each call, the ``next_dist`` calls, the
exception and message of every kind of bad law. Models that overwrite the array they returned (one array object
for every call, views into one buffer) give the bound of a model that returns fresh arrays, to the bit: the copy
the check makes is what keeps them right (a route that reads the models' arrays as given reads another law).
"""

from __future__ import annotations

import numpy as np
import pytest

import otspec._validation as VAL
import otspec.models as MOD
from otspec import _validation_kernel as LK
from otspec._validation import NEGLIGIBLE, law_into, validate_distribution
from otspec.models import MemorylessModel, next_law, random_markov_model
from otspec.tree import TreeShape, bound
from otspec.tree._bound import _ModelLaws, _row_blocks, _sampled, _Slots
from otspec.tree._bound_union import union_bound
from otspec.tree._process import LawCache

needs_jit = pytest.mark.skipif(not LK.JIT, reason="numba not installed: the numpy passes are the only route")

U = 2.0 ** -53


class _Hashed:
    """A ``next_dist`` model at any vocabulary: after each prefix a law drawn from gamma variates seeded by the
    prefix (about a fifth of its entries exactly 0), a fresh array per call; counts its calls."""

    def __init__(self, V, seed, shape=0.3):
        self.vocab_size, self.seed, self.shape, self.calls = V, seed, shape, []

    def next_dist(self, prefix):
        self.calls.append(tuple(prefix))
        g = np.random.default_rng([self.seed, len(prefix), *prefix])
        x = g.gamma(self.shape, size=self.vocab_size)
        x[g.random(self.vocab_size) < 0.2] = 0.0
        x[int(g.integers(self.vocab_size))] += 1e-3
        return x / x.sum()


class _Cached:
    """The route before: each model's laws memoised in a :class:`LawCache` (a fresh row per law, kept)."""

    def __init__(self, draft, target, V, ctx):
        self.d, self.t, self.calls = LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target"), 0

    def __call__(self, paths):
        self.calls += 1
        return [self.d(s) for s in paths], [self.t(s) for s in paths]


def _old_check(monkeypatch):
    """Turn the one-read acceptance off: every law checked as before (the kernel's copy, numpy's sum)."""
    monkeypatch.setattr(VAL, "law_into", lambda *a, **k: None)
    monkeypatch.setattr(MOD, "law_into", lambda *a, **k: None)


def _outcome(r):
    return (r.value, r.per_depth.tolist(), r.lower_per_depth.tolist(), r.remainder, r.n_expanded, r.n_calls,
            r.complete, r.pi_exact, r.method)


def _recording(laws):
    """``laws`` with the prefixes of each call recorded (``laws.asked``)."""
    laws.asked = []
    call = laws.__call__

    class Rec(type(laws)):
        def __call__(self, paths):
            self.asked.append([tuple(s) for s in paths])
            return call(paths)

    laws.__class__ = Rec
    return laws


def _run(laws_cls, shape, draft, target, process, budget, batch, method, ctx=()):
    laws = _recording(laws_cls(draft, target, draft.vocab_size, tuple(ctx)))
    run = _sampled if method == "paths" else union_bound
    return run(_Slots(shape), process, laws, budget, batch), laws.asked


# --------------------------------------------------------------------------- the route before, to the bit
CASES = [
    ("iid", TreeShape.branching(8, 7), 3000, 90, 16),
    ("wor", TreeShape.branching(8, 7), 3000, 90, 16),
    ("iid", TreeShape([(0,), (3,), (0, 0), (0, 2), (3, 1), (0, 0, 0), (0, 2, 1)]), 700, 40, 8),
    ("wor", TreeShape([(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 1), (1, 0)]), 700, 40, 8),
    ("wor", TreeShape.branching(3, 2, 2), 6, 60, 7),           # small V: draws enumerated (the block route)
    ("iid", TreeShape.branching(2, 2), 4, 30, 1),
]


@pytest.mark.parametrize("process, shape, V, budget, batch", CASES)
@pytest.mark.parametrize("method", ["paths", "union"])
def test_laws_given_are_the_cached_laws_to_the_bit(process, shape, V, budget, batch, method, monkeypatch):
    if method == "union" and V > 1000:
        budget = 20                                            # the union's reductions are numpy passes
    ctx = (3, 1)
    d, t = _Hashed(V, 1), _Hashed(V, 2, shape=0.5)
    new, asked = _run(_ModelLaws, shape, d, t, process, budget, batch, method, ctx)
    calls = (list(d.calls), list(t.calls))
    d.calls.clear(), t.calls.clear()
    _old_check(monkeypatch)
    old, asked_old = _run(_Cached, shape, d, t, process, budget, batch, method, ctx)
    assert _outcome(new) == _outcome(old)
    assert asked == asked_old and len(asked) == new.n_calls
    assert calls == (d.calls, t.calls)                          # one next_dist call per prefix asked, as before
    assert len(set(calls[0])) == len(calls[0]) == new.n_expanded
    monkeypatch.undo()
    if method == "paths":                                      # the public entry: the same
        assert _outcome(bound(shape, d, t, process=process, prefix=ctx, budget=budget, batch=batch)) == _outcome(new)


def test_one_block_per_model_overwritten_by_the_next_call():
    """The rows of a call: read-only rows of one block per model (one group for the row kernels), apart from the
    model's arrays, equal to the checked laws; the next call writes the same block."""
    V = 500
    d, t = _Hashed(V, 3), _Hashed(V, 4)
    laws = _ModelLaws(d, t, V, (7,))
    paths = [(i,) for i in range(6)]
    P, Q = laws(paths)
    assert len(_row_blocks(P, Q)) == 1 and all(not x.flags.writeable for x in P + Q)
    for s, p, q in zip(paths, P, Q):
        np.testing.assert_array_equal(p, validate_distribution(d.next_dist((7,) + s), "p"))
        np.testing.assert_array_equal(q, validate_distribution(t.next_dist((7,) + s), "q"))
    first = P[0].copy()
    P2, _Q2 = laws([(9, 9)])
    assert P2[0].base is P[0].base and not np.array_equal(P[0], first)     # valid until the next call only
    assert laws.calls == 2


# --------------------------------------------------------------------------- models that overwrite their arrays
class _SameArray:
    """Returns one array object for every call, overwritten with the law asked for."""

    def __init__(self, model):
        self.model, self.vocab_size = model, model.vocab_size
        self.buf = np.empty(model.vocab_size)

    def next_dist(self, prefix):
        self.buf[:] = self.model.next_dist(prefix)
        return self.buf


class _BufferViews:
    """Returns read-only views of the rows of one buffer, cycled through and overwritten."""

    def __init__(self, model, rows=2):
        self.model, self.vocab_size = model, model.vocab_size
        self.buf, self.k = np.empty((rows, model.vocab_size)), 0

    def next_dist(self, prefix):
        self.k = (self.k + 1) % self.buf.shape[0]
        self.buf[self.k] = self.model.next_dist(prefix)
        v = self.buf[self.k].view()
        v.flags.writeable = False
        return v


class _AsGiven(_ModelLaws):
    """A route without the copy: the models' arrays read as they returned them (wrong for the models above)."""

    def __call__(self, paths):
        self.calls += 1
        return ([np.asarray(self.models[0].next_dist(self.ctx + s)) for s in paths],
                [np.asarray(self.models[1].next_dist(self.ctx + s)) for s in paths])


@pytest.mark.parametrize("wrap", [_SameArray, _BufferViews])
@pytest.mark.parametrize("process, shape, V", [("iid", TreeShape.branching(4, 3), 400),
                                               ("wor", TreeShape.branching(4, 3), 400),
                                               ("wor", TreeShape.branching(3, 2), 5)])
def test_models_that_overwrite_their_arrays_give_the_bound_of_fresh_arrays(wrap, process, shape, V):
    d, t = _Hashed(V, 11), _Hashed(V, 12)
    want = bound(shape, d, t, process=process, budget=40, batch=8)
    for method in ("paths", "union"):
        got = bound(shape, wrap(d), wrap(t), process=process, budget=40, batch=8, method=method)
        assert _outcome(got) == _outcome(bound(shape, d, t, process=process, budget=40, batch=8, method=method))
    assert _outcome(bound(shape, wrap(d), wrap(d), process="topk", budget=40)) == \
        _outcome(bound(shape, d, d, process="topk", budget=40))
    # the models break a route that reads their arrays as given: the comparison above can fail
    wrong = _sampled(_Slots(shape), process, _AsGiven(wrap(d), wrap(t), V, ()), 40, 8)
    assert wrong.value != want.value


# --------------------------------------------------------------------------- bad laws: the same refusal
class _BadAt:
    """A good model but at one prefix, where it returns ``row`` (anything)."""

    def __init__(self, model, at, row):
        self.model, self.at, self.row, self.vocab_size = model, at, row, model.vocab_size

    def next_dist(self, prefix):
        return self.row if tuple(prefix) == self.at else self.model.next_dist(prefix)


def _bad_rows(V):
    rng = np.random.default_rng(9)
    x = rng.random(V)
    x /= x.sum()
    neg, nan, inf, ninf, big, small, short, f32, f32_off, sub, neg_sub, neg_small = (x.copy() for _ in range(12))
    neg[3] = -0.01
    neg_small[0] += neg_small[6] + 1e-12
    neg_small[6] = -1e-12                                      # the total still 1 within the tolerance
    nan[V - 1] = np.nan
    inf[7] = np.inf
    ninf[0] = -np.inf
    big *= 1.5
    small *= 1 - 2e-9
    short = short[:-1]
    f32 = f32.astype(np.float32)                               # within 2 V eps32 of 1: accepted, rescaled
    f32_off = (f32_off * 1.01).astype(np.float32)
    sub[0] += sub[2] + sub[4]
    sub[[2, 4]] = [5e-324, 1e-310]                             # flushed to 0, accepted
    neg_sub[0] += neg_sub[5]
    neg_sub[5] = -1e-320                                       # flushed to 0 by the copy, but negative
    return dict(negative=neg, nan=nan, inf=inf, minus_inf=ninf, sum_above=big, sum_below=small,
                negative_small=neg_small, wrong_length=short, float32=f32, float32_off=f32_off, subnormals=sub,
                negative_subnormal=neg_sub,
                as_list=list(x), two_d=x[None, :], ints=np.ones(V, dtype=np.int64))


def _attempt(fn):
    try:
        return _outcome(fn()), None
    except (ValueError, TypeError) as exc:
        return None, (type(exc), str(exc))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("kind", sorted(_bad_rows(8)))
@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("V", [8, 1000])
def test_bad_laws_get_the_same_refusal_and_message(kind, process, V, monkeypatch):
    shape = TreeShape.branching(3, 2)
    row = _bad_rows(V)[kind]
    good_d, good_t = _Hashed(V, 21), _Hashed(V, 22)
    first = bound(shape, good_d, good_t, process=process, budget=12, batch=4)
    assert first.n_expanded > 2
    deeper = next(s for s in good_d.calls if s)                # a prefix after the root that the bound expands
    for who, at in (("draft", ()), ("target", deeper)):
        d = _BadAt(good_d, at, row) if who == "draft" else good_d
        t = _BadAt(good_t, at, row) if who == "target" else good_t
        got = _attempt(lambda d=d, t=t: bound(shape, d, t, process=process, budget=12, batch=4))
        with monkeypatch.context() as m:
            _old_check(m)
            want = _attempt(lambda d=d, t=t: _sampled(_Slots(shape), process, _Cached(d, t, V, ()), 12, 4))
        assert got == want, (kind, who, got, want)
        if kind in ("float32", "subnormals", "as_list"):
            assert got[0] is not None
        else:
            assert got[1] is not None and f"`{who}.next_dist({at})`" in got[1][1]


def test_messages_of_bad_laws_word_for_word():
    good = MemorylessModel([0.25] * 4)
    cases = [
        ([0.5, 0.5, -0.1, 0.1], ValueError, "`target.next_dist((0,))` must be non-negative, got minimum -0.1 at index 2"),
        ([0.5, np.nan, 0.5, 0.0], ValueError, "`target.next_dist((0,))` must be finite, got 1 non-finite entries"),
        # (no hint to pass normalize=True: the bound takes no such option)
        ([0.5, 0.5, 0.5, 0.5], ValueError, "`target.next_dist((0,))` must sum to 1 within 1e-09, got 2.0"),
        ([0.5, 0.5, 0.0], ValueError, "`target.next_dist((0,))` must have shape (4,) (vocab_size=4), got (3,)"),
    ]
    for row, exc, msg in cases:
        with pytest.raises(exc) as info:
            bound(TreeShape.branching(2, 2), good, _BadAt(good, (0,), np.array(row)), process="iid")
        assert str(info.value) == msg


# --------------------------------------------------------------------------- the one-read acceptance
def _decision(x, **kw):
    try:
        return validate_distribution(x, "p", **kw), None
    except (ValueError, TypeError) as exc:
        return None, (type(exc), str(exc))


def _near_the_tolerance(rng, n, tol, side):
    """Rows whose numpy total is within a few units of the last place of ``1 + side * tol``: one entry nudged in
    small steps across the edge (the lanes' total and numpy's differ in the last bits)."""
    x = rng.random(n)
    x *= (1.0 + side * tol) / x.sum()
    base = x[0]
    out = []
    for k in range(-40, 41):
        y = x.copy()
        y[0] = base + k * 2.0 ** -55
        out.append(y)
    return out


@needs_jit
@pytest.mark.parametrize("n", [9, 1000, 49152])
def test_acceptance_is_numpys_at_the_edge_of_the_tolerance(n, monkeypatch):
    """Rows at the edge of the tolerance, where the lanes' total and numpy's fall on either side of it: the same
    decision and result as numpy's total gives, every time. A test of the margin: without it (``|t - 1| <= tol``
    on the lanes' total) some of these rows would be accepted that numpy refuses, or the other way."""
    rng = np.random.default_rng(n)
    straddle = 0
    for side in (1, -1):
        for tol in (VAL.SIMPLEX_TOL, 1e-8):
            for y in _near_the_tolerance(rng, n, tol, side):
                got = _decision(y, tol=tol)
                t = LK.law_copy_sum(y, np.empty(n))
                T = float(y.sum())
                straddle += (abs(t - 1.0) <= tol) != (abs(T - 1.0) <= tol)
                with monkeypatch.context() as m:
                    _old_check(m)
                    want = _decision(y, tol=tol)
                assert got[1] == want[1]
                if want[0] is not None:
                    np.testing.assert_array_equal(got[0].view(np.int64), want[0].view(np.int64))
    if n > 100:
        assert straddle                          # rows that a margin-free check would decide the other way


@needs_jit
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_law_into_accepts_only_what_numpy_accepts_and_returns_its_bits(monkeypatch):
    rng = np.random.default_rng(4)
    rows = []
    for n in (1, 2, 7, 8, 9, 127, 128, 129, 1000, 49152):
        x = rng.random(n) ** rng.integers(1, 12)
        x[rng.random(n) < 0.3] = 0.0
        x[0] += 1e-9
        rows.append(x / x.sum())
        rows.append(x / x.sum() * (1 + 3e-10))
        rows.append(x / x.sum() * (1 - 1.2e-9))
    rows += [np.array([0.5, 0.5, 5e-324, -0.0]), np.array([1.0]), np.array([0.0]), np.array([1e308, 1e308]),
             np.array([0.5, np.inf]), np.array([0.5, np.nan, 0.5]), np.array([1.5, -0.5]), np.array([0.7, -1e-320, 0.3])]
    taken = 0
    for x in rows:
        before = x.copy()
        out = np.full(x.shape, 7.0)
        block = np.full((2, x.shape[0]), 7.0)
        with monkeypatch.context() as m:
            _old_check(m)
            want = _decision(x)
        for o in (None, out, block[1]):
            got = law_into(x, o)
            np.testing.assert_array_equal(x.view(np.int64), before.view(np.int64))
            if got is None:
                continue
            taken += 1
            assert want[0] is not None and not got.flags.writeable
            np.testing.assert_array_equal(got.view(np.int64), want[0].view(np.int64))
            if o is not None:
                assert np.shares_memory(got, o) and (got is o) == (o.base is None)
        np.testing.assert_array_equal(block[0], 7.0)
    assert taken >= 3 * 15
    x = rows[8]
    assert law_into(x, x) is None and law_into(x, np.empty(x.shape[0], np.float32)) is None   # the full check's case
    assert law_into(x.astype(np.float32)) is None and law_into(list(x)) is None and law_into(x[:0]) is None


@needs_jit
def test_law_copy_sum_flushes_refuses_and_bounds_its_total():
    x = np.array([0.25, 0.0, -0.0, 5e-324, NEGLIGIBLE, 0.75])
    out = np.full(x.shape, 9.0)
    t = LK.law_copy_sum(x, out)
    want = np.array([0.25, 0.0, 0.0, 0.0, NEGLIGIBLE, 0.75])
    np.testing.assert_array_equal(out.view(np.int64), want.view(np.int64))
    assert t == 0.25 + 0.75 + NEGLIGIBLE
    for bad in (np.nan, -0.5, -1e-320, -np.inf):
        y = x.copy()
        y[2] = bad
        assert np.isnan(LK.law_copy_sum(y, np.empty(6)))
    y = x.copy()
    y[1] = np.inf
    assert LK.law_copy_sum(y, np.empty(6)) == np.inf
    rng = np.random.default_rng(2)
    for n in (3, 100, 4097, 49152, 151936):
        y = rng.random(n) * rng.choice([1e-8, 1.0, 1e5], n)
        o = np.empty(n)
        t = LK.law_copy_sum(y, o)
        np.testing.assert_array_equal(o, y)
        assert abs(t - float(y.sum())) <= 2 * n * U * float(y.sum())


@needs_jit
def test_next_law_accepts_a_good_law_without_the_full_check(monkeypatch):
    """The common case takes the one read: no numpy pass, no message built (the full check refused here)."""
    def refuse(*a, **k):
        raise AssertionError("the full check ran")

    monkeypatch.setattr(MOD, "validate_distribution", refuse)
    m = random_markov_model(50, rng=1)
    got = next_law(m, (3,), 50, "draft")
    assert not got.flags.writeable and got.base is None
    np.testing.assert_array_equal(got, m.next_dist((3,)))
    block = np.empty((2, 50))
    assert np.shares_memory(next_law(m, (4,), 50, "draft", out=block[1]), block[1])
    with pytest.raises(AssertionError, match="full check"):
        next_law(_BadAt(m, (1,), np.full(50, 0.03)), (1,), 50, "draft")
