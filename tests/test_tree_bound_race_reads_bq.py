"""The race's grown heads on the bound's torch route: every growth of a frontier's race read with the first.

Where the exponential race (:class:`otspec.tree._bound._Race`) refuses a row with its first head (32 tokens) it grows
the head (x4) and does the row again; on the torch route each growth read the grown head's stats (its tokens, their
probabilities, the tail's power sums) from the device, one read a growth (``branching(16, 4)`` at V = 3,000: four,
the context's head grown to 128, 512, 2,048 and 3,000 tokens). Now the first growth reads the stats of every head the
race may grow to in one read (:class:`otspec.tree._bound._GrownHeads`), each by the same arithmetic on the same
rows. Checked here: the reads of one bound (pinned; main at 2d13785 reads 6 and 8 for ``branching(16, 4)``), the
bound equal to the bit to the route that reads once per growth (the code before, kept as the fallback) and to the
numpy route at its stated tolerance, on shapes and laws where heads grow (near-uniform and LLM-like laws, V 2 ..
3,000, several rows growing at once), and the grown stats themselves equal to the bit to one read per growth.
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
from tests.test_tree_bound_reads_bh import _adversarial, _run, _same  # noqa: E402

_GROWN = B._GrownHeads


class _Counted:
    """:class:`otspec.tree._bound._GrownHeads` (or the per-growth route) with the growths it served counted."""

    def __init__(self, per_growth: bool):
        self.per_growth, self.growths, self.races = per_growth, 0, []

    def __call__(self, P):
        grown = _GROWN(P)
        self.races.append(0)
        n = len(self.races) - 1

        def stats(todo, K):
            self.growths += 1
            self.races[n] += 1
            if self.per_growth:                       # the code before: one read of its own per growth
                return B._race_stats_t(P, K, rows=todo)[1:6]
            return grown(todo, K)
        return stats


def _both(shape, draft, target, budget, batch, monkeypatch, umax=None):
    """The torch route with the growths read together and one read per growth: ``(new, old, growths)``, or with
    ``umax`` (the race's acceptance's clock range, :data:`otspec.tree._bound._RACE_UMAX`, lowered so that heads
    grow) ``(new, old, growths, reads saved)``: each race whose head grew reads once for all its growths."""
    out = []
    for per_growth in (False, True):
        c = _Counted(per_growth)
        with monkeypatch.context() as mp:
            mp.setattr(B, "_GrownHeads", c)
            if umax is not None:
                mp.setattr(B, "_RACE_UMAX", umax)
            out.append(_run(shape, "wor", draft, target, budget, batch, True, mp))
        out.append((c.growths, sum(g - 1 for g in c.races if g)))
    if umax is None:
        return out[0], out[2], out[1][0]
    return out[0], out[2], out[1][0], out[1][1]


#: Host reads of one bound (budget 256, 64 a call), measured, against main (2d13785): branching(16, 4)'s context
#: grows its head twice at V = 300 (6 reads then, 5 now) and four times at V = 3,000 (8 then, 5 now: its race then
#: refused and the row read once for the host's route); the shapes whose heads do not grow keep their reads. Since
#: the refused race's laws come with its last heads (tests/test_tree_bound_reads_bv.py): 4.
READS = {300: {"(16,4)": 4, "(8,7)": 4, "(4,3,2)": 10}, 3000: {"(16,4)": 4, "(8,7)": 4, "(4,3,2)": 10}}
SHAPES = {"(16,4)": TreeShape.branching(16, 4), "(8,7)": TreeShape.branching(8, 7),
          "(4,3,2)": TreeShape.branching(4, 3, 2)}


@pytest.mark.parametrize("V", [300, 3000])
@pytest.mark.parametrize("name", list(SHAPES))
def test_reads_of_one_bound(name, V):
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    laws = _Laws(draft, target, True)
    with HostReads() as mode:
        got = B._sampled(B._Slots(SHAPES[name]), "wor", laws, 256, 64)
    assert laws.calls == got.n_calls == 5
    assert len(mode.reads) == READS[V][name], mode.reads


@pytest.mark.parametrize(("V", "umax"), [(300, 0.1), (3000, 0.03)])
def test_growths_read_together_equal_one_read_per_growth(V, umax, monkeypatch):
    # since the race's step comes from a proven error bound (no comparison with the step 2h, which refused the
    # context's row at rank 15 with its first heads) these laws' races accept their first heads; a lowered clock
    # range of the acceptance (umax) makes heads grow, several times in some races (10 and 11 growths)
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    new, old, growths, saved = _both(TreeShape.branching(16, 4), draft, target, 256, 64, monkeypatch, umax)
    assert growths > 1 and saved > 1                     # the heads grew more than once in a race
    _same(old, new, bits=True)
    assert old[2] - new[2] == saved                      # one read for all of a race's growths instead of one each
    with monkeypatch.context() as mp:
        mp.setattr(B, "_RACE_UMAX", umax)
        _same(_run(TreeShape.branching(16, 4), "wor", draft, target, 256, 64, False, mp), new)


SHAPES_GROW = [TreeShape.branching(16, 4), TreeShape.branching(8, 7), TreeShape.branching(4, 3, 2),
               TreeShape.branching(3, 3, 3), TreeShape.chains(3, 4)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(SHAPES_GROW), V=st.sampled_from([2, 3, 5, 40, 120, 300, 1000, 3000]),
       kinds=st.lists(st.sampled_from(["near-uniform", "uniform", "llm", "peaked", "ties", "zeros"]),
                      min_size=1, max_size=5),
       budget=st.sampled_from([9, 64, 150]), batch=st.sampled_from([8, 64]), seed=st.integers(0, 2**16))
def test_torch_route_with_grown_heads(shape, V, kinds, budget, batch, seed, monkeypatch):
    if max(shape.ranks) + 1 > V:
        return
    rng = np.random.default_rng(seed)
    rows = []
    for k in kinds:
        if k == "near-uniform":                      # within a few percent of uniform: the race grows its heads
            p = 1.0 + 0.05 * rng.random(V)
            rows.append(p / p.sum())
        else:
            rows.append(_adversarial(k, V, rng))
    bank = np.stack(rows)
    draft, target = _Bank(bank, 0), _Bank(bank[::-1].copy(), 3)
    new, old, _ = _both(shape, draft, target, budget, batch, monkeypatch)
    _same(old, new, bits=True)                       # to the bit with one read per growth
    assert new[2] <= old[2]
    _same(_run(shape, "wor", draft, target, budget, batch, False, monkeypatch), new)


@pytest.mark.parametrize(("m", "V", "K"), [(1, 3000, 32), (5, 300, 32), (7, 1000, 128), (3, 40, 32)])
@pytest.mark.parametrize("shrink", [False, True])
def test_grown_stats_equal_one_read_per_growth(m, V, K, shrink):
    # every head from K up to V for m rows in one read, asked for the same rows at each growth (one read in all)
    # or for fewer rows at each growth (some accepted: each growth of other rows reads again), against one read
    # of its own per growth (the code before)
    rng = np.random.default_rng(m * V)
    P = 1.0 + 0.05 * rng.random((m, V))
    P[0, : V // 3] = 0.0                                 # a row with a smaller support
    P /= P.sum(axis=1, keepdims=True)
    T = torch.from_numpy(P)
    grown = B._GrownHeads(T)
    todo, k, growths, fewer = list(range(m)), K, 0, 0
    with HostReads() as mode:
        while True:
            got = grown(todo, k)
            growths += 1
            for a, b in zip(got, B._race_stats_t(T, k, rows=todo)[1:6]):
                assert a.dtype == b.dtype and np.array_equal(a, b)
            if k >= V:
                break
            if shrink and len(todo) > 1:
                todo, fewer = todo[1:], fewer + 1
            k = min(V, 4 * k)
    assert growths > 1
    assert len(mode.reads) == growths + 1 + fewer, mode.reads


@pytest.mark.parametrize(("cap", "reads"), [(1, 5), (3 * (32 + 128), 4), (3 * (32 + 128 + 512), 3), (2**18, 1)])
def test_heads_read_ahead_within_their_cap(cap, reads, monkeypatch):
    # the heads read ahead of their growths stay within _MAX_GROWN_ENTRIES (rows x head sizes): at a serving V
    # the heads up to V would bring rows x V values back for growths that may never come. With the cap lowered,
    # each read holds the first head asked for and the later ones that fit; the stats stay the bits of one read
    # per growth, and the bound the bits of the route without the cap
    m, V, K = 3, 3000, 32
    rng = np.random.default_rng(7)
    P = 1.0 + 0.05 * rng.random((m, V))
    P /= P.sum(axis=1, keepdims=True)
    T = torch.from_numpy(P)
    monkeypatch.setattr(B, "_MAX_GROWN_ENTRIES", cap)
    seen = []
    real = B._race_levels_steps

    def spy(P_, levels, rows):
        seen.append(list(levels))
        return real(P_, levels, rows)

    monkeypatch.setattr(B, "_race_levels_steps", spy)
    grown, k, sizes = B._GrownHeads(T), K, []
    while True:
        for a, b in zip(grown(list(range(m)), k), B._race_stats_t(T, k, rows=list(range(m)))[1:6]):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        sizes.append(k)
        if k >= V:
            break
        k = min(V, 4 * k)
    assert [s for levels in seen for s in levels] == sizes            # every head read once, in order
    for levels in seen:
        assert len(levels) == 1 or m * sum(levels) <= cap             # past the first, within the cap
    assert len(seen) == reads, seen                                   # heads 32, 128, 512, 2048, 3000


def test_bound_with_heads_read_one_by_one_is_the_same(monkeypatch):
    # the cap at its least (every growth reads its own head): the bound to the bit of the default cap's; the
    # acceptance's clock range lowered so that heads grow (the race accepts these rows' first heads since its step
    # comes from a proven error bound)
    draft, target = _pair(3000, ["llm", "peaked", "llm"], 5)
    shape = TreeShape.branching(16, 4)
    monkeypatch.setattr(B, "_RACE_UMAX", 0.03)
    ref = _run(shape, "wor", draft, target, 256, 64, True, monkeypatch)
    with monkeypatch.context() as mp:
        mp.setattr(B, "_MAX_GROWN_ENTRIES", 1)
        one = _run(shape, "wor", draft, target, 256, 64, True, mp)
    _same(ref, one, bits=True)
    assert one[2] > ref[2]                                            # more reads: one per growth
