"""The laws given to ``otspec.tree.bound``: where each is checked, and that it is checked once.

* otspec's own table models (``TableModel``, ``MemorylessModel``, ``MarkovModel``) check their tables when they
  are made; a table whose every row is a law that the check in place accepts as it is (``_rows_in_place``) is
  recorded (``otspec.models.checked_tables``) and its laws skip the check in the row kernels' pass: the same bound,
  bit for bit, as the same arrays handed over by a user's model (main's route, the fused check), with no check
  call (counted);
* a user's model, a subclass, or a table swapped after construction keeps the fused check and its messages;
* decoding models (``score_tree``): a NaN or ``+inf`` logit, or a row with no finite logit, is refused with a clear
  error (it gave a NaN bound, i.i.d., or a silently wrong one without replacement, 3.0 on a depth-2 tree), on the
  host at once and for laws left on an accelerator at the bound's end.
"""

from __future__ import annotations

import numpy as np
import pytest

import otspec.tree._bound as TB
from otspec.models import MarkovModel, MemorylessModel, TableModel, checked_tables
from otspec.tree import TreeShape, bound

pytestmark = pytest.mark.skipif(not TB._LK.JIT, reason="the fused check needs numba")


class _User:
    """A user's ``next_dist`` model over the same arrays (declares ``fresh_laws``: main's fused route)."""

    fresh_laws = True

    def __init__(self, model):
        self.model, self.vocab_size = model, model.vocab_size

    def next_dist(self, prefix):
        return self.model.next_dist(prefix)


def _bits(r):
    return (r.value, r.remainder, r.n_expanded, r.complete, r.pi_exact, r.per_depth.tolist(),
            r.lower_per_depth.tolist())


def _pairs(V: int, seed: int):
    rng = np.random.default_rng(seed)
    lo = rng.dirichlet(np.full(V, 0.2), size=V)
    lo[:, 0] = 0.0                                          # exact zeros (+0.0) are in place
    lo /= lo.sum(axis=1, keepdims=True)
    yield "memoryless", MemorylessModel(rng.dirichlet(np.full(V, 0.3))), MemorylessModel(rng.dirichlet(np.ones(V)))
    yield "markov", MarkovModel(lo), MarkovModel(rng.dirichlet(np.ones(V), size=V))
    yield "table", TableModel([rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V), size=V),
                               rng.dirichlet(np.full(V, 0.5), size=(V, V))]), \
        TableModel([rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V), size=V),
                    rng.dirichlet(np.ones(V), size=(V, V))])


class _Count:
    """Calls of the check around the row kernels: the fused resolution, the check on reading, and the kernels
    asked to check rows (``chk`` passed)."""

    def __init__(self, monkeypatch):
        self.fused = self.next_law = self.kernel_checks = self.kernel_calls = 0
        fused, nl, rows, row = TB._fused_checked, TB.next_law, TB._K.iid_rows, TB._K.iid_row

        def fused_(*a, **k):
            self.fused += 1
            return fused(*a, **k)

        def nl_(*a, **k):
            self.next_law += 1
            return nl(*a, **k)

        def rows_(*a):
            self.kernel_calls += 1
            self.kernel_checks += len(a) == 19
            return rows(*a)

        def row_(*a):
            self.kernel_calls += 1
            self.kernel_checks += len(a) == 16
            return row(*a)

        monkeypatch.setattr(TB, "_fused_checked", fused_)
        monkeypatch.setattr(TB, "next_law", nl_)
        monkeypatch.setattr(TB._K, "iid_rows", rows_)
        monkeypatch.setattr(TB._K, "iid_row", row_)


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("V", [3, 12])
@pytest.mark.parametrize("dims,budget,batch", [((3, 2), 40, 8), ((2, 2, 2), 5, 2), ((4,), 1, 1)])
def test_checked_models_same_bits_as_the_fused_route(process, V, dims, budget, batch):
    # the same arrays by a user's model (main's route: the check in the kernels' pass) give the same bits
    if process == "wor" and max(dims) > V:
        pytest.skip("more ranks than tokens")
    shape = TreeShape.branching(*dims)
    for kind, d, t in _pairs(V, 7 + V):
        assert checked_tables(d) is not None and checked_tables(t) is not None, kind
        got = bound(shape, d, t, process=process, budget=budget, batch=batch)
        want = bound(shape, _User(d), _User(t), process=process, budget=budget, batch=batch)
        assert _bits(got) == _bits(want), kind


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_checked_models_not_checked_twice(process, monkeypatch):
    V = 12
    shape = TreeShape.branching(3, 2, 2)
    for kind, d, t in _pairs(V, 3):
        c = _Count(monkeypatch)
        bound(shape, d, t, process=process, budget=30, batch=8)
        assert (c.fused, c.next_law, c.kernel_checks) == (0, 0, 0), kind
        if process == "iid":
            assert c.kernel_calls > 0
        u = _Count(monkeypatch)                         # the count can fail: a user's model is checked
        bound(shape, _User(d), _User(t), process=process, budget=30, batch=8)
        assert u.fused + u.next_law > 0, kind
        if process == "iid":
            assert u.kernel_checks > 0


def test_marker_not_given_to_others():
    p = np.array([0.25, 0.75])
    m = MemorylessModel(p)
    assert checked_tables(m) is not None

    class Sub(MemorylessModel):
        def next_dist(self, prefix):
            return np.array([0.5, 0.6])

    assert checked_tables(Sub(p)) is None                   # a subclass may return other laws
    assert checked_tables(_User(m)) is None
    m.checked = True                                        # no attribute makes a model checked
    assert checked_tables(MemorylessModel(p)) is not None
    # rows with an entry the check would change (-0.0, subnormal): not marked (checked in the kernels, as before)
    assert checked_tables(MarkovModel([[1.0, -0.0], [0.5, 0.5]])) is None
    assert checked_tables(TableModel([[1.0 - 2 ** -60, 1e-310]])) is not None  # flushed at construction: marked
    assert checked_tables(MarkovModel([[1.0, 0.0], [0.5, 0.5]])) is not None


def test_minus_zero_table_same_bits_as_main_route():
    T = np.array([[0.7, -0.0, 0.3], [0.2, 0.5, 0.3], [-0.0, 0.4, 0.6]])
    d, t = MarkovModel(T), MarkovModel(np.array([[0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.5, 0.25, 0.25]]))
    assert checked_tables(d) is None and checked_tables(t) is not None
    shape = TreeShape.branching(2, 2)
    for process in ("iid", "wor"):
        a = bound(shape, d, t, process=process, budget=10, batch=3)
        b = bound(shape, _User(d), _User(t), process=process, budget=10, batch=3)
        assert _bits(a) == _bits(b)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_swapped_table_still_refused(process):
    # a checked model whose table is replaced after construction: the new array is not the one checked, so it is
    # checked in the kernels' pass (main's message)
    d = MemorylessModel([0.25, 0.25, 0.5])
    t = MemorylessModel([0.5, 0.25, 0.25])
    t.dist = np.array([0.5, np.nan, 0.5])
    with pytest.raises(ValueError, match=r"`target.next_dist\(\(\)\)` must be finite, got 1 non-finite entries"):
        bound(TreeShape.branching(2, 2), d, t, process=process, budget=4)
    t.dist = np.array([0.5, 0.25, 0.3])
    with pytest.raises(ValueError, match=r"`target.next_dist\(\(\)\)` must sum to 1 within 1e-09"):
        bound(TreeShape.branching(2, 2), d, t, process=process, budget=4)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_user_models_bad_laws_refused_as_on_main(process):
    good = MemorylessModel([0.25, 0.25, 0.5])

    class Bad:
        fresh_laws, vocab_size = True, 3

        def next_dist(self, prefix):
            return np.array([0.5, -0.25, 0.75]) if len(prefix) == 1 else np.array([0.2, 0.3, 0.5])

    with pytest.raises(ValueError, match=r"`draft.next_dist\(\(\d,\)\)` must be non-negative, got minimum -0.25"):
        bound(TreeShape.branching(2, 2), Bad(), good, process=process, budget=5)


# decoding models: a bad logit refused, never a NaN or silently wrong bound


def _lm(bad_after=None, how="nan", V=20):
    torch = pytest.importorskip("torch")
    from otspec.decoding import CallableLM

    def f(ids):
        x = torch.sin(ids[..., None].double() * torch.arange(V).double() * 0.37) * 3
        if bad_after is not None:
            x = x.clone()
            hit = ids == bad_after
            if how == "nan":
                x[..., 5] = torch.where(hit, float("nan"), x[..., 5])
            elif how == "inf":
                x[..., 5] = torch.where(hit, float("inf"), x[..., 5])
            else:
                x = torch.where(hit[..., None], float("-inf"), x)
        return x.float()

    return CallableLM(f, vocab_size=V)


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("how", ["nan", "inf", "none finite"])
def test_decoding_model_bad_logits_refused(process, how):
    good = _lm()
    shape = TreeShape.branching(3, 2)
    ok = bound(shape, good, good, process=process, prefix=[1], budget=8)
    assert np.isfinite(ok.value) and ok.value <= shape.max_depth
    with pytest.raises(ValueError, match=r"`target` gave no law after the prefix \(1,\): its logits there hold a NaN"):
        bound(shape, good, _lm(1, how), process=process, prefix=[1], budget=8)
    # a bad row deeper in the tree (after a token 4 of the draft's children, at depth >= 1): its prefix named
    with pytest.raises(ValueError, match=r"`draft` gave no law after the prefix \(1, .*4\)"):
        bound(shape, _lm(4, how), good, process=process, prefix=[1], budget=8)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_decoding_model_bad_logits_refused_on_device_route(process, monkeypatch):
    # laws left where the model gives them (tensors, as on an accelerator; here CPU tensors): the flags read at the
    # bound's end, the same error
    torch = pytest.importorskip("torch")
    real = TB._tree_laws

    def as_tensor(*a, **k):
        out = real(*a, **k)
        return torch.from_numpy(out) if isinstance(out, np.ndarray) else out

    monkeypatch.setattr(TB, "_tree_laws", as_tensor)
    good = _lm()
    shape = TreeShape.branching(3, 2)
    monkeypatch.setattr(TB, "_tree_laws", real)
    host = bound(shape, good, good, process=process, prefix=[1], budget=8)
    monkeypatch.setattr(TB, "_tree_laws", as_tensor)
    dev = bound(shape, good, good, process=process, prefix=[1], budget=8)
    assert abs(dev.value - host.value) <= 1e-12 * host.value
    with pytest.raises(ValueError, match=r"`target` gave no law after the prefix \(1,\)"):
        bound(shape, good, _lm(1), process=process, prefix=[1], budget=8)


def test_decoding_model_own_score_tree_checked():
    torch = pytest.importorskip("torch")
    good = _lm()

    class OwnScores:
        """A decoding model with its own ``score_tree`` (no ``tree_logits``): its laws checked in full."""

        def __init__(self, lm, scale):
            self.lm, self.scale, self.vocab_size = lm, scale, lm.vocab_size

        def new_state(self):
            return self.lm.new_state()

        def select(self, *a):
            return self.lm.select(*a)

        def score_tree(self, state, parents, tokens, *, pending):
            x = self.lm.tree_logits(state, parents, tokens, pending=pending)
            return (torch.softmax(x.to(torch.float64), dim=-1) * self.scale).numpy()

    shape = TreeShape.branching(2, 2)
    a = bound(shape, OwnScores(good, 1.0), OwnScores(good, 1.0), process="iid", prefix=[1], budget=6)
    b = bound(shape, good, good, process="iid", prefix=[1], budget=6)
    assert _bits(a) == _bits(b)
    with pytest.raises(ValueError, match=r"`draft.score_tree` gave no law after the prefix \(1,\): .* sum to 1"):
        bound(shape, OwnScores(good, 1.1), good, process="iid", prefix=[1], budget=6)
