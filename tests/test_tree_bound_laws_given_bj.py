"""The bound with laws from ``next_dist`` models that declare ``fresh_laws``: each law read where it is, checked in
one read, not copied (otspec.models.next_law with ``in_place=True``, otspec._validation.law_in_place,
otspec._validation_kernel.law_check_sum, otspec.tree._bound._ModelLaws).

Independent route: the copying route (the same models without the declaration: each law copied into the block as
it is checked), and :func:`otspec._validation.validate_distribution` for single laws. Against it, to the bit: the
bound's value, per-depth sums, remainder, flags, the prefixes of each call, the ``next_dist`` calls, every refusal
and its message. A model that declares the promise and breaks it gets another bound (the route really reads the
models' arrays); a draft that declares it beside a target that does not and overwrites the draft's memory is copied.
"""

from __future__ import annotations

import numpy as np
import pytest

import otspec._validation as VAL
import otspec.models as MOD
from otspec import _validation_kernel as LK
from otspec._validation import law_in_place, validate_distribution
from otspec.models import MarkovModel, MemorylessModel, TableModel, next_law
from otspec.tree import TreeShape, bound
from otspec.tree._bound import _ModelLaws, _sampled, _Slots
from otspec.tree._bound_union import union_bound

needs_jit = pytest.mark.skipif(not LK.JIT, reason="numba not installed: every law is copied")


class _Hashed:
    """A ``next_dist`` model at any vocabulary: after each prefix a law drawn from gamma variates seeded by the
    prefix (about a fifth of its entries exactly 0), a new array per call; records its calls and the arrays it
    returned. ``fresh`` sets ``fresh_laws`` (None: no attribute)."""

    def __init__(self, V, seed, fresh=None, shape=0.3):
        self.vocab_size, self.seed, self.shape, self.calls, self.given = V, seed, shape, [], []
        if fresh is not None:
            self.fresh_laws = fresh

    def law(self, prefix):
        g = np.random.default_rng([self.seed, len(prefix), *prefix])
        x = g.gamma(self.shape, size=self.vocab_size)
        x[g.random(self.vocab_size) < 0.2] = 0.0
        x[int(g.integers(self.vocab_size))] += 1e-3
        return x / x.sum()

    def next_dist(self, prefix):
        self.calls.append(tuple(prefix))
        x = self.law(prefix)
        self.given.append(x)
        return x


def _outcome(r):
    return (r.value, r.per_depth.tolist(), r.lower_per_depth.tolist(), r.remainder, r.n_expanded, r.n_calls,
            r.complete, r.pi_exact, r.method)


class _Asked(_ModelLaws):
    """:class:`_ModelLaws` recording the prefixes of each call and whether each row shares memory with an array
    the model returned (read in place)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.asked, self.shared = [], [0, 0]

    def __call__(self, paths):
        self.asked.append([tuple(s) for s in paths])
        n = [len(m.given) if hasattr(m, "given") else 0 for m in self.models]
        P, Q = super().__call__(paths)
        for k, rows in enumerate((P, Q)):
            given = getattr(self.models[k], "given", [])[n[k]:]
            self.shared[k] += sum(any(np.shares_memory(r, g) for g in given) for r in rows)
        return P, Q

    def unchecked(self, paths):
        # the search's call with the laws' check left to the row kernels (task BO): recorded as __call__ is
        before = len(self.asked)
        n = [len(m.given) if hasattr(m, "given") else 0 for m in self.models]
        P, Q, pending = super().unchecked(paths)
        if len(self.asked) == before:          # not through __call__ (which records itself)
            self.asked.append([tuple(s) for s in paths])
            for k, rows in enumerate((P, Q)):
                given = getattr(self.models[k], "given", [])[n[k]:]
                self.shared[k] += sum(any(np.shares_memory(r, g) for g in given) for r in rows)
        return P, Q, pending


def _run(shape, d, t, process, budget, batch, method, ctx=()):
    laws = _Asked(d, t, d.vocab_size, tuple(ctx))
    run = _sampled if method == "paths" else union_bound
    return run(_Slots(shape), process, laws, budget, batch), laws


CASES = [
    ("iid", TreeShape.branching(8, 7), 3000, 60, 16),
    ("wor", TreeShape.branching(8, 7), 3000, 60, 16),
    ("iid", TreeShape([(0,), (3,), (0, 0), (0, 2), (3, 1), (0, 0, 0), (0, 2, 1)]), 700, 40, 8),
    ("wor", TreeShape([(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 1), (1, 0)]), 700, 40, 8),
    ("wor", TreeShape.branching(3, 2, 2), 6, 60, 7),           # small V: draws enumerated (the block route)
    ("iid", TreeShape.branching(2, 2), 4, 30, 1),
]


# --------------------------------------------------------------------------- the copying route, to the bit
@needs_jit
@pytest.mark.parametrize("process, shape, V, budget, batch", CASES)
@pytest.mark.parametrize("method", ["paths", "union"])
def test_fresh_laws_read_in_place_give_the_copying_routes_bound_to_the_bit(process, shape, V, budget, batch,
                                                                          method):
    if method == "union" and V > 100:
        budget = 16                                            # the union's reductions are numpy passes
    ctx = (3, 1)
    runs = {}
    for fresh in (True, None):
        d, t = _Hashed(V, 1, fresh), _Hashed(V, 2, fresh, shape=0.5)
        res, laws = _run(shape, d, t, process, budget, batch, method, ctx)
        runs[fresh] = (_outcome(res), laws.asked, d.calls, t.calls, laws.shared, res)
    new, old = runs[True], runs[None]
    assert new[:4] == old[:4]                      # value, sums, remainder, flags; prefixes per call; next_dist calls
    assert len(new[2]) == new[5].n_expanded
    n = sum(len(a) for a in new[1])
    assert new[4] == [n, n] and old[4] == [0, 0]   # every row read where the model put it (the route taken), or copied
    if method == "paths":
        d, t = _Hashed(V, 1, True), _Hashed(V, 2, True, shape=0.5)
        assert _outcome(bound(shape, d, t, process=process, prefix=ctx, budget=budget, batch=batch)) == new[0]


@needs_jit
def test_rows_read_in_place_are_read_only_and_the_models_arrays_unchanged():
    V = 500
    d, t = _Hashed(V, 3, True), _Hashed(V, 4, True)
    laws = _ModelLaws(d, t, V, (7,))
    P, Q = laws([(i,) for i in range(5)])
    for rows, m in ((P, d), (Q, t)):
        for r, g in zip(rows, m.given):
            assert np.shares_memory(r, g) and not r.flags.writeable and g.flags.writeable   # a view, g untouched
            np.testing.assert_array_equal(r.view(np.int64), validate_distribution(g, "p").view(np.int64))
    m = MemorylessModel([0.25, 0.75])
    assert next_law(m, (0,), 2, "draft", in_place=True) is m.dist      # read-only already: the array itself
    assert laws.blocks[0].shape == (5, V)          # allocated, never written (no page touched)


@pytest.mark.parametrize("flag", [1, "yes", np.True_, False])
def test_only_the_bool_true_declares(flag):
    V = 300
    d, t = _Hashed(V, 5, flag), _Hashed(V, 6, flag)
    laws = _Asked(d, t, V, ())
    laws([(0,), (1,)])
    assert laws.shared == [0, 0]


def test_shipped_models_declare_and_return_arrays_nothing_writes():
    rng = np.random.default_rng(0)
    T = TableModel([[0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]]])
    M = MarkovModel(rng.dirichlet(np.ones(3), size=3))
    for m in (T, M, MemorylessModel([0.25, 0.75]), MarkovModel([0.5, 0.5])):
        assert m.fresh_laws is True
        for s in ((), (1,)):
            x = m.next_dist(s)
            assert not x.flags.writeable and (x.base is None or not x.base.flags.writeable)
    import torch

    from otspec.decoding import CallableLM, as_model

    tq = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    am = as_model(CallableLM(lambda ids: tq[ids], 4), context=(1,))
    a, b = am.next_dist(()), am.next_dist(())
    assert am.fresh_laws is True and not np.shares_memory(a, b)        # a new array per call


# --------------------------------------------------------------------------- broken promises, aliasing
class _SameArrayFresh:
    """Declares ``fresh_laws`` but returns one array object for every call, overwritten: the model's bug."""

    fresh_laws = True

    def __init__(self, model):
        self.model, self.vocab_size = model, model.vocab_size
        self.buf = np.empty(model.vocab_size)

    def next_dist(self, prefix):
        self.buf[:] = self.model.law(prefix)
        return self.buf


@needs_jit
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_a_broken_promise_is_read_as_given(process):
    """The route reads the models' arrays: a model that declares the promise and overwrites its array gets another
    bound (so the comparisons above can fail); the same model without the declaration gets the right one."""
    V, shape = 400, TreeShape.branching(4, 3)
    want = bound(shape, _Hashed(V, 11), _Hashed(V, 12), process=process, budget=40, batch=8)
    wrong = bound(shape, _SameArrayFresh(_Hashed(V, 11)), _SameArrayFresh(_Hashed(V, 12)), process=process,
                  budget=40, batch=8)
    assert wrong.value != want.value
    d, t = _SameArrayFresh(_Hashed(V, 11)), _SameArrayFresh(_Hashed(V, 12))
    d.fresh_laws = t.fresh_laws = False
    assert _outcome(bound(shape, d, t, process=process, budget=40, batch=8)) == _outcome(want)


class _Shared:
    """One buffer of ``rows`` rows behind a draft and a target: each call writes its law into the next row (cycled,
    shared by both models) and returns a read-only view of it."""

    def __init__(self, V, rows):
        self.buf, self.k = np.empty((rows, V)), 0

    def put(self, x):
        self.k = (self.k + 1) % self.buf.shape[0]
        self.buf[self.k] = x
        v = self.buf[self.k].view()
        v.flags.writeable = False
        return v


class _OnShared:
    def __init__(self, model, shared, fresh):
        self.model, self.shared, self.vocab_size = model, shared, model.vocab_size
        self.fresh_laws = fresh

    def next_dist(self, prefix):
        return self.shared.put(self.model.law(prefix))


@needs_jit
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_a_fresh_draft_beside_a_target_that_overwrites_its_memory_is_copied(process):
    """A draft that declares ``fresh_laws`` and a target that does not, both on one buffer: the target's calls of a
    frontier (after every draft call of it) overwrite the rows of the draft's laws, so the draft's laws are
    copied; the bound is the one of new arrays. Read in place, the draft's rows would be the target's laws."""
    V, shape, batch = 400, TreeShape.branching(4, 3), 8
    want = bound(shape, _Hashed(V, 11), _Hashed(V, 12), process=process, budget=40, batch=batch)
    buf = _Shared(V, batch)                        # the target's `batch` calls overwrite every row
    d, t = _OnShared(_Hashed(V, 11), buf, True), _OnShared(_Hashed(V, 12), buf, False)
    assert _outcome(bound(shape, d, t, process=process, budget=40, batch=batch)) == _outcome(want)
    laws = _ModelLaws(d, t, V, ())
    assert laws.in_place == (False, False)
    # the route that would read this draft in place reads another bound (the guard is needed)
    laws.in_place = (True, False)
    wrong = _sampled(_Slots(shape), process, laws, 40, batch)
    assert wrong.value != want.value


@needs_jit
@pytest.mark.parametrize("process", ["iid", "wor"])
def test_draft_and_target_sharing_memory_read_in_place(process):
    """Both declare ``fresh_laws`` and their arrays share memory: the same model object twice (one array for both
    at a prefix), and views of one read-only table (both models' rows of one base): the copying route's bound."""
    V, shape = 300, TreeShape.branching(4, 3)
    m = _Hashed(V, 31, True)
    same, laws = _run(shape, m, m, process, 40, 8, "paths")
    n = sum(len(a) for a in laws.asked)
    assert laws.shared == [n, n]
    c = _Hashed(V, 31)
    assert _outcome(same) == _outcome(_run(shape, c, c, process, 40, 8, "paths")[0])
    rng = np.random.default_rng(2)
    table = rng.dirichlet(np.full(V, 0.3), size=(2 * V,))
    table.setflags(write=False)                    # one read-only base: the draft's rows above, the target's below
    got = bound(shape, _TableRows(table, 0, True), _TableRows(table, V, True), process=process, prefix=(0,),
                budget=40, batch=8)
    d, t = _TableRows(table, 0, True), _TableRows(table, V, True)
    res, laws = _run(shape, d, t, process, 40, 8, "paths", (0,))
    assert _outcome(res) == _outcome(got)
    assert laws.shared == [sum(len(a) for a in laws.asked)] * 2
    want = bound(shape, _TableRows(table, 0, None), _TableRows(table, V, None), process=process, prefix=(0,),
                 budget=40, batch=8)
    assert _outcome(got) == _outcome(want)


class _TableRows:
    """The law after a prefix: row ``offset + last token`` of a read-only table (views of one base)."""

    def __init__(self, table, offset, fresh):
        self.table, self.offset, self.vocab_size, self.given = table, offset, table.shape[1], []
        if fresh is not None:
            self.fresh_laws = fresh

    def next_dist(self, prefix):
        x = self.table[self.offset + prefix[-1]]
        self.given.append(x)
        return x


# --------------------------------------------------------------------------- bad laws: the same refusal
def _bad_rows(V):
    rng = np.random.default_rng(9)
    x = rng.random(V)
    x /= x.sum()
    rows = {k: x.copy() for k in ("negative", "nan", "inf", "minus_inf", "sum_above", "sum_below", "negative_small",
                                  "subnormals", "negative_subnormal", "minus_zero", "neg_nan")}
    rows["negative"][3] = -0.01
    rows["negative_small"][0] += rows["negative_small"][6] + 1e-12
    rows["negative_small"][6] = -1e-12
    rows["nan"][V - 1] = np.nan
    rows["neg_nan"][1] = -np.nan
    rows["inf"][7] = np.inf
    rows["minus_inf"][0] = -np.inf
    rows["sum_above"] *= 1.5
    rows["sum_below"] *= 1 - 2e-9
    s = rows["subnormals"]
    s[0] += s[2] + s[4]
    s[[2, 4]] = [5e-324, 1e-310]                               # flushed to 0 by the copy, accepted
    ns = rows["negative_subnormal"]
    ns[0] += ns[5]
    ns[5] = -1e-320
    mz = rows["minus_zero"]
    mz[0] += mz[3]
    mz[3] = -0.0                                               # flushed to +0.0 by the copy, accepted
    rows.update(wrong_length=x[:-1].copy(), float32=x.astype(np.float32),
                float32_off=(x * 1.01).astype(np.float32), as_list=list(x), two_d=x[None, :].copy(),
                ints=np.ones(V, dtype=np.int64), strided=np.repeat(x, 2)[::2], big_endian=x.astype(">f8"))
    return rows


def _attempt(fn):
    try:
        return _outcome(fn()), None
    except (ValueError, TypeError) as exc:
        return None, (type(exc), str(exc))


class _BadAt:
    """A model (declaring ``fresh``) good but at one prefix, where it returns ``row``."""

    def __init__(self, model, at, row, fresh):
        self.model, self.at, self.row, self.vocab_size = model, at, row, model.vocab_size
        self.fresh_laws = fresh

    def next_dist(self, prefix):
        return self.row if tuple(prefix) == self.at else self.model.law(prefix)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("kind", sorted(_bad_rows(8)))
@pytest.mark.parametrize("V", [8, 1000])
def test_bad_laws_get_the_copying_routes_refusal_and_message(kind, V):
    shape = TreeShape.branching(3, 2)
    row = _bad_rows(V)[kind]
    before = np.array(row, copy=True) if isinstance(row, np.ndarray) else None
    good_d, good_t = _Hashed(V, 21), _Hashed(V, 22)
    first = bound(shape, good_d, good_t, process="iid", budget=12, batch=4)
    assert first.n_expanded > 2
    deeper = next(s for s in good_d.calls if s)
    for process in ("iid", "wor"):
        for who, at in (("draft", ()), ("target", deeper)):
            got = []
            for fresh in (True, False):
                d = _BadAt(good_d, at if who == "draft" else None, row, fresh)
                t = _BadAt(good_t, at if who == "target" else None, row, fresh)
                got.append(_attempt(lambda d=d, t=t, p=process: bound(shape, d, t, process=p, budget=12, batch=4)))
            assert got[0] == got[1], (kind, who, got)
            if kind in ("float32", "subnormals", "as_list", "minus_zero", "strided", "big_endian"):
                assert got[0][0] is not None
            else:
                assert got[0][1] is not None and f"`{who}.next_dist({at})`" in got[0][1][1]
    if before is not None:
        np.testing.assert_array_equal(np.ascontiguousarray(row).view(np.uint8), before.view(np.uint8))   # never mutated


# --------------------------------------------------------------------------- the one-read check in place
@needs_jit
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_law_in_place_accepts_only_what_the_copy_accepts_with_its_bits():
    """Where :func:`law_in_place` accepts, :func:`validate_distribution` accepts and returns the same bits, and the
    result shares the input's memory; entries the copy would change (``-0.0``, subnormals) and bad rows are
    declined (None). A kernel that let ``-0.0`` or a subnormal through would fail on the bits."""
    rng = np.random.default_rng(4)
    n_accepted = 0
    for V in (1, 2, 9, 1000, 49152):
        for _ in range(5):
            x = rng.gamma(0.3, size=V)
            x[rng.random(V) < 0.2] = 0.0
            x[0] += 1e-3
            x /= x.sum()
            variants = [x]
            for bad in (-0.0, 1e-310, 5e-324, -1e-320, -1e-3, np.nan, -np.nan, np.inf, -np.inf):
                y = x.copy()
                y[V // 2] = bad
                variants.append(y)
            variants += [x * (1 + 2e-9), x * (1 - 2e-9), x * (1 + 5e-10)]
            for y in variants:
                flags = y.flags.writeable
                got = law_in_place(y)
                try:
                    want = validate_distribution(y, "p")
                except ValueError:
                    want = None
                assert y.flags.writeable == flags
                if got is None:
                    continue
                n_accepted += 1
                assert want is not None and np.shares_memory(got, y) and not got.flags.writeable
                np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))
    assert n_accepted >= 25
    x = np.array([0.25, 0.75])
    for y in (x.astype(np.float32), x[::-1], np.repeat(x, 2)[::2], x[None, :], np.empty(0), list(x),
              np.array([0.25, -0.0, 0.75]), np.array([0.5, 5e-324, 0.5])):
        assert law_in_place(y) is None


@needs_jit
def test_law_check_sum_flags_every_entry_the_copy_would_change():
    """The kernel's bit test against :func:`otspec._validation_kernel.law_copy`: NaN exactly where the flushed copy
    differs from the row in some bit or the row has a bad entry."""
    specials = [0.0, -0.0, 5e-324, 1e-310, LK.TINY, -LK.TINY, 1e-300, 0.5, 1.0, 2.0, np.inf, -np.inf, np.nan, -np.nan,
                np.finfo(np.float64).max, -1.0]
    for v in specials:
        for V in (1, 7, 64):
            y = np.full(V, 1.0 / V)
            y[V // 3] = v
            out = np.empty(V)
            bad = LK.law_copy(y, out)
            changed = bad or not np.array_equal(out.view(np.int64), y.view(np.int64))
            assert np.isnan(LK.law_check_sum(y, y.view(np.int64))) == bool(changed), v


def test_without_numba_every_law_is_copied(monkeypatch):
    monkeypatch.setattr(LK, "JIT", False)
    x = np.array([0.25, 0.75])
    assert law_in_place(x) is None
    V, shape = 50, TreeShape.branching(2, 2)
    d, t = _Hashed(V, 41, True), _Hashed(V, 42, True)
    res, laws = _run(shape, d, t, "iid", 10, 4, "paths")
    assert laws.shared == [0, 0]
    monkeypatch.undo()
    assert _outcome(res) == _outcome(_run(shape, _Hashed(V, 41), _Hashed(V, 42), "iid", 10, 4, "paths")[0])


def test_the_copying_check_is_unchanged_for_fresh_models(monkeypatch):
    """With the in-place check off (``law_in_place`` returning None) a declaring model is copied: the same bound."""
    V, shape = 300, TreeShape.branching(3, 2)
    want = _outcome(bound(shape, _Hashed(V, 51, True), _Hashed(V, 52, True), process="wor", budget=12, batch=4))
    monkeypatch.setattr(MOD, "law_in_place", lambda *a, **k: None)
    monkeypatch.setattr(VAL, "law_in_place", lambda *a, **k: None)
    # and the check in the row kernels' pass (task BO) off: every law checked on reading
    monkeypatch.setattr(_ModelLaws, "unchecked", lambda self, paths: (*self(paths), None))
    d, t = _Hashed(V, 51, True), _Hashed(V, 52, True)
    res, laws = _run(shape, d, t, "wor", 12, 4, "paths")
    assert laws.shared == [0, 0] and _outcome(res) == want
