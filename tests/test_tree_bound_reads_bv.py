"""The race refused after its last growth on the bound's torch route: its laws read with the grown heads.

Where the exponential race (:class:`otspec.tree._bound._Race`) grows a row's head to the whole row and still refuses
it, the torch route hands the frontier's rows to the host's route (:func:`otspec.tree._bound._host_route_steps`),
which read the draft and target blocks in one read of their own. Now the growth that reads every head up to ``V``
(:class:`otspec.tree._bound._GrownHeads`: no later growth can read again) reads those blocks in the same copy when
they fit within ``_MAX_GROWN_ENTRIES``, so a refusal costs no read (``branching(16, 4)`` at V = 300 .. 3,000: 4 host
reads a bound, 5 on main at c85c2d0). Checked here: the reads pinned (main fails them), the bound, remainder and
per-depth sums to the bit against the route that reads the laws on their own (main's code path, kept where the
blocks do not fit) on laws whose heads grow (near-uniform rows, some accepted at an intermediate head, some refused
at ``V``) and against the numpy route at its stated tolerance, and the blocks read ahead equal to the bit to the
host route's own read.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import otspec.tree._bound as B  # noqa: E402
from otspec.tree import TreeShape  # noqa: E402
from tests.test_profile_host_reads import HostReads  # noqa: E402
from tests.test_tree_bound_device import _Bank, _Laws, _pair  # noqa: E402
from tests.test_tree_bound_reads_bh import _adversarial, _routes_agree, _run, _same  # noqa: E402

_GROWN = B._GrownHeads


class _Unread(_GROWN):
    """:class:`otspec.tree._bound._GrownHeads` that never reads the laws with its heads (``Q`` dropped): main's
    route, a refused race's laws read on their own by the host's route."""

    Q = property(lambda self: None, lambda self, value: None)


class _Spy(_GROWN):
    """:class:`otspec.tree._bound._GrownHeads` that records every instance (their ``laws`` and blocks)."""

    made: list = []

    def __init__(self, P):
        super().__init__(P)
        _Spy.made.append(self)


def _refuse(mp, deg: int, below: int | None = None):
    """Make the race refuse the rows of its calls of ``deg`` (its largest rank + 1) or more (at a head of fewer than
    ``below`` tokens; None: at every head, so refused at ``V``), as its check of the steps ``h`` and ``2h`` refused
    the context's rows of these laws before the step came from a proven error bound (which accepts them at their
    first head): the route a refusal takes is what these tests are about, not its cause."""
    real = B._K.race_rows_weighted

    def refusing(PH, kh, pmax, nu, ranks, wts, d, *rest):
        real(PH, kh, pmax, nu, ranks, wts, d, *rest)
        if d >= deg and (below is None or PH.shape[1] < below):
            rest[-2][:, 2] = 0.0                          # info: the right end not reached
    mp.setattr(B._K, "race_rows_weighted", refusing)


def _both(shape, draft, target, budget, batch, monkeypatch):
    """``(new, old)``: :func:`tests.test_tree_bound_reads_bh._run` on the torch route with the laws read with the
    last heads (now) and on their own (main)."""
    out = []
    for cls in (_GROWN, _Unread):
        with monkeypatch.context() as mp:
            mp.setattr(B, "_GrownHeads", cls)
            out.append(_run(shape, "wor", draft, target, budget, batch, True, mp))
    return out[0], out[1]


#: Host reads of one bound without replacement (budget 256, 64 a call: 5 calls), measured; main (c85c2d0) in
#: parentheses. branching(16, 4): the context's race grows its head to V (one read for every growth) and is
#: refused, its laws now read in that read (main: one more, the host's route's); the shapes whose race accepts at
#: its first head read as before (two a call whose rows need the race: the quadrature on the host between them).
READS = {"(16,4)": 4, "(8,7)": 4, "(4,3,2)": 10}          # main: 5, 4, 10
SHAPES = {"(16,4)": TreeShape.branching(16, 4), "(8,7)": TreeShape.branching(8, 7),
          "(4,3,2)": TreeShape.branching(4, 3, 2)}


@pytest.mark.parametrize("V", [300, 1000, 3000])
@pytest.mark.parametrize("name", list(SHAPES))
def test_reads_of_one_bound(name, V):
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    laws = _Laws(draft, target, True)
    with HostReads() as mode:
        got = B._sampled(B._Slots(SHAPES[name]), "wor", laws, 256, 64)
    assert laws.calls == got.n_calls == 5
    assert len(mode.reads) == READS[name], mode.reads


@pytest.mark.parametrize("V", [300, 1000, 3000])
def test_refused_race_reads_its_laws_with_its_heads(V, monkeypatch):
    # branching(16, 4)'s context: every head up to V read in one growth, the race refused, the laws from that read:
    # one read fewer than main's route and the same bound, remainder and per-depth sums to the bit
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    _refuse(monkeypatch, 16)                                      # the context's race (ranks up to 15) refused
    _Spy.made = []
    with monkeypatch.context() as mp:
        mp.setattr(B, "_GrownHeads", _Spy)
        new = _run(TreeShape.branching(16, 4), "wor", draft, target, 256, 64, True, mp)
    read = [g for g in _Spy.made if g.laws is not None]
    assert len(read) == 1                                         # the context's: its race refused at V
    g = read[0]
    assert np.array_equal(g.laws, torch.cat([g.P.reshape(-1), g.Q.reshape(-1)]).numpy().reshape(g.laws.shape))
    new2, old = _both(TreeShape.branching(16, 4), draft, target, 256, 64, monkeypatch)
    _same(old, new, bits=True)
    _same(new2, new, bits=True)
    assert old[2] - new[2] == 1
    _same(_run(TreeShape.branching(16, 4), "wor", draft, target, 256, 64, False, monkeypatch), new)


def test_laws_past_the_cap_are_read_as_before(monkeypatch):
    # room for every head of the context's row up to V but not for its laws: no laws read ahead, the host's route
    # reads them (main's reads), the same bits
    V = 3000
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    heads = 128 + 512 + 2048 + 3000                   # the growth's heads (the first, 32, came with the power sums)
    shape = TreeShape.branching(16, 4)
    _refuse(monkeypatch, 16)                          # the context's race refused at every head
    ref = _run(shape, "wor", draft, target, 256, 64, True, monkeypatch)
    with monkeypatch.context() as mp:
        mp.setattr(B, "_MAX_GROWN_ENTRIES", heads + 2 * V - 1)
        tight = _run(shape, "wor", draft, target, 256, 64, True, mp)
    with monkeypatch.context() as mp:
        mp.setattr(B, "_MAX_GROWN_ENTRIES", heads + 2 * V)
        fits = _run(shape, "wor", draft, target, 256, 64, True, mp)
    _same(ref, tight, bits=True)
    _same(ref, fits, bits=True)
    assert (ref[2], fits[2], tight[2]) == (4, 4, 5)


def test_a_one_read_generator_with_tensors():
    # _with_tensors: the generator's own values, then the extra tensors', from one read
    a, b = torch.arange(6, dtype=torch.float64), torch.tensor([[7.0, 8.0], [9.0, 10.0]])

    def one():
        got = yield [a]
        return got * 2

    with HostReads() as mode:
        own, extra = B._run_reads([B._with_tensors(one(), [b])])[0]
    assert len(mode.reads) == 1
    assert np.array_equal(own, np.arange(6) * 2.0) and np.array_equal(extra, [7.0, 8.0, 9.0, 10.0])

    def two():
        yield [a]
        yield [a]

    with pytest.raises(RuntimeError, match="second read"):
        B._run_reads([B._with_tensors(two(), [b])])


SHAPES_GROW = [TreeShape.branching(16, 4), TreeShape.branching(8, 7), TreeShape.branching(4, 3, 2),
               TreeShape.branching(3, 3, 3), TreeShape.chains(3, 4), TreeShape.branching(12, 2)]


def _tiered(V: int, rng: np.random.Generator) -> np.ndarray:
    """A quarter of the vocabulary 30 times as likely as the rest, within 1 %: the race of ranks up to 7 accepts
    such a row at a head of 128 tokens at V = 300 (grown once)."""
    p = np.where(np.arange(V) < V // 4, 30.0, 1.0) * (1.0 + 0.01 * rng.random(V))
    return p / p.sum()


def test_race_accepted_at_an_intermediate_head(monkeypatch):
    # the context grows its head once (32 -> 128) and is accepted there: the laws read with the heads (every head
    # up to V = 300 fits) are left unused, the reads and the bits are main's
    V = 300
    rng = np.random.default_rng(3)
    bank = np.stack([_tiered(V, rng) for _ in range(3)])
    draft, target = _Bank(bank, 0), _Bank(bank[::-1].copy(), 3)
    _refuse(monkeypatch, 8, below=128)                # the context's race (ranks up to 7) refused at 32 tokens
    _Spy.made = []
    kept = []
    real = B._Race.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        kept.append(self)

    with monkeypatch.context() as mp:
        mp.setattr(B, "_GrownHeads", _Spy)
        mp.setattr(B._Race, "__init__", spy)
        new = _run(TreeShape.branching(8, 7), "wor", draft, target, 64, 64, True, mp)
    assert [g.laws is not None for g in _Spy.made] == [True]
    assert kept[0].ok.all() and kept[0].head.shape[1] == 128           # accepted at the head of 128
    new2, old = _both(TreeShape.branching(8, 7), draft, target, 64, 64, monkeypatch)
    _same(old, new, bits=True)
    _same(old, new2, bits=True)
    assert old[2] == new[2]
    _same(_run(TreeShape.branching(8, 7), "wor", draft, target, 64, 64, False, monkeypatch), new)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(SHAPES_GROW), V=st.sampled_from([20, 40, 120, 300, 1000]),
       kinds=st.lists(st.sampled_from(["near-uniform", "tiered", "uniform", "llm", "peaked", "ties", "zeros"]),
                      min_size=1, max_size=5),
       budget=st.sampled_from([9, 64, 150]), batch=st.sampled_from([8, 64]), seed=st.integers(0, 2**16))
def test_torch_route_with_laws_read_ahead(shape, V, kinds, budget, batch, seed, monkeypatch):
    # heads that grow (near-uniform rows), some accepted at an intermediate head (tiered rows), some refused at V:
    # the bound to the bit of main's route, never more reads, and the numpy route's at its tolerance
    if max(shape.ranks) + 1 > V:
        return
    rng = np.random.default_rng(seed)
    rows = []
    for k in kinds:
        if k == "near-uniform":                      # within a few percent of uniform: the race grows its heads
            p = 1.0 + 0.05 * rng.random(V)
        elif k == "tiered":                          # a peaked top over a flat tail: grown once or twice
            p = _tiered(V, rng)
        else:
            p = _adversarial(k, V, rng)
        rows.append(p / p.sum())
    bank = np.stack(rows)
    draft, target = _Bank(bank, 0), _Bank(bank[::-1].copy(), 3)
    new, old = _both(shape, draft, target, budget, batch, monkeypatch)
    _same(old, new, bits=True)
    assert new[2] <= old[2]
    _same(_run(shape, "wor", draft, target, budget, batch, False, monkeypatch), new)


@pytest.mark.parametrize(("shape", "V", "kinds", "seed"), [
    (TreeShape.branching(16, 4), 300, ["near-uniform", "llm"], 1),
    (TreeShape.branching(8, 7), 3000, ["uniform", "llm", "peaked"], 2),
    (TreeShape.branching(4, 3, 2), 1000, ["zeros", "ties", "llm"], 3),
])
def test_routes_agree_on_adversarial_laws(shape, V, kinds, seed, monkeypatch):
    for budget, batch in ((64, 64), (150, 8)):
        _routes_agree("wor", shape, V, kinds, budget, batch, False, seed, monkeypatch)
