"""The bound's device route reads the last expanded depth with later rounds: fewer host reads, the same bound.

The expansions of the last expanded depth (``D - 1``) give row sums that feed the bound's value only, never a
candidate, so no choice of a later frontier waits for them: :func:`otspec.tree._bound._sampled` keeps them unread
and advances them in the rounds of later frontiers (:class:`otspec.tree._bound._Reads`), reading what is left after
the search. Checked here: the read counts (pinned; the code before read every call), the bound bit for bit against
the same route with every call read at once (the code before), the torch route against the numpy route (values to
1e-12, the same prefixes in the same order) on adversarial laws, errors raised in the host route's order, and the
cap on what is held unread.
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
from tests.test_tree_bound_device import _Bank, _law, _Laws, _pair  # noqa: E402

EXACT = 1e-12


def _run(shape, process, draft, target, budget, batch, as_tensor, monkeypatch):
    """``(bound or error message, the frontiers' paths in order of expansion, host reads)``."""
    order: list = []
    advance = B._Search.advance

    def recording(self):
        got = advance(self)
        order.append([u.path for u in got])
        return got

    with monkeypatch.context() as mp, HostReads() as mode:
        mp.setattr(B._Search, "advance", recording)
        try:
            res = B._sampled(B._Slots(shape), process, _Laws(draft, target, as_tensor), budget, batch)
        except ValueError as e:
            res = str(e)
    return res, order, len(mode.reads)


def _same(a, b, bits: bool = False) -> None:
    (ra, oa, _), (rb, ob, _) = a, b
    if isinstance(ra, str) or isinstance(rb, str):
        assert ra == rb                                         # the same error, from the same prefix
        return
    assert oa == ob                                             # the same prefixes, in the same order
    assert (ra.n_expanded, ra.n_calls, ra.complete, ra.pi_exact) == (rb.n_expanded, rb.n_calls, rb.complete,
                                                                     rb.pi_exact)
    if bits:
        assert (ra.value, ra.remainder, ra.per_depth.tolist(), ra.lower_per_depth.tolist()) == \
            (rb.value, rb.remainder, rb.per_depth.tolist(), rb.lower_per_depth.tolist())
        return
    assert abs(ra.value - rb.value) <= EXACT * max(ra.value, 1.0)
    assert abs(ra.remainder - rb.remainder) <= EXACT * max(ra.value, 1.0)
    np.testing.assert_allclose(rb.per_depth, ra.per_depth, rtol=EXACT, atol=1e-300)
    np.testing.assert_allclose(rb.lower_per_depth, ra.lower_per_depth, rtol=EXACT, atol=1e-300)


# ----------------------------------------------------------------------------------------------- read counts
#: Host reads of one bound on the device route (batch 64, V = 300 and 3,000: the same), measured. branching(8, 7)
#: has depth 2, so every frontier after the context's is the last depth: at budget 256 (5 calls) i.i.d. 2 reads
#: (the context's, then the four last-depth calls' together) and without replacement 4 (2 + 2: the race's power
#: sums, then the values); before (commit c435899) 5 and 10, one and two a call. At budget 64 (2 calls) and for
#: deeper shapes, whose every call holds a depth with candidates, as before: one read a call (i.i.d.), two without
#: replacement.
READS = {("iid", (8, 7), 64): 2, ("iid", (8, 7), 256): 2, ("wor", (8, 7), 64): 4, ("wor", (8, 7), 256): 4,
         ("iid", (4, 3, 2), 256): 5, ("wor", (4, 3, 2), 256): 10}


@pytest.mark.parametrize(("process", "dims", "budget"), list(READS))
@pytest.mark.parametrize("V", [300, 3000])
def test_reads_of_one_bound(process, dims, budget, V):
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    laws = _Laws(draft, target, True)
    with HostReads() as mode:
        got = B._sampled(B._Slots(TreeShape.branching(*dims)), process, laws, budget, 64)
    assert laws.calls == got.n_calls == (2 if budget == 64 else 5)
    assert len(mode.reads) == READS[(process, dims, budget)], mode.reads


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("dims", [(8, 7), (4, 3, 2), (3, 3, 3, 2)])
def test_the_same_bound_to_the_bit_as_every_call_read_at_once(process, dims, monkeypatch):
    # with nothing held unread (the cap at 0) every call is read when it is made, as before: the same expansions on
    # the same tensors, so the same bits, in more reads (branching(8, 7): 5 and 10, the counts before)
    draft, target = _pair(3000, ["llm", "peaked", "llm"], 5)
    shape = TreeShape.branching(*dims)
    held = _run(shape, process, draft, target, 256, 64, True, monkeypatch)
    monkeypatch.setattr(B, "_DEFERRED_ENTRIES", 0)
    at_once = _run(shape, process, draft, target, 256, 64, True, monkeypatch)
    _same(held, at_once, bits=True)
    if dims == (8, 7):
        assert (held[2], at_once[2]) == ((2, 5) if process == "iid" else (4, 10))


def test_the_cap_on_entries_held_unread(monkeypatch):
    # room for one call's rows (64 x V): each later last-depth call reads the one held before with its own rounds
    V = 300
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    shape = TreeShape.branching(8, 7)
    free = _run(shape, "iid", draft, target, 256, 64, True, monkeypatch)
    monkeypatch.setattr(B, "_DEFERRED_ENTRIES", 64 * V)
    capped = _run(shape, "iid", draft, target, 256, 64, True, monkeypatch)
    _same(free, capped, bits=True)
    assert (free[2], capped[2]) == (2, 3)


# ----------------------------------------------------------------------------------------------- errors in order
def _raises_at(round_: int, msg: str):
    for _ in range(round_):
        yield [torch.zeros(1, dtype=torch.float64)]
    raise ValueError(msg)


def _returns_after(rounds: int, value):
    for _ in range(rounds):
        yield [torch.ones(2, dtype=torch.float64)]
    return value


def test_reads_raise_the_first_started_generators_error():
    # the host's route runs the expansions one after the other, so it raises the first one's error: a generator
    # started later that raises sooner (round 1) does not hide an earlier one's (round 3)
    reads = B._Reads([_returns_after(1, "a"), _raises_at(3, "first"), _returns_after(5, "b")])
    reads.add([_raises_at(1, "second"), _returns_after(0, "c")])
    with pytest.raises(ValueError, match="first"):
        reads.until([3])
    reads = B._Reads([_raises_at(2, "first"), _raises_at(0, "second")])
    with pytest.raises(ValueError, match="first"):
        reads.finish()


def test_reads_until_leaves_the_others_pending():
    with HostReads() as mode:
        reads = B._Reads([_returns_after(4, "held")])
        ids = reads.add([_returns_after(2, "now")])
        assert reads.until(ids) == ["now"]
        assert 0 in reads.pending and len(mode.reads) == 2     # two rounds, the held one advanced in both
        assert reads.finish() == ["held", "now"] and len(mode.reads) == 4


def test_support_error_of_a_held_expansion_comes_first(monkeypatch):
    # a last-depth prefix whose draft law has too few tokens for its children (held unread when it is expanded)
    # and, in the next call, a prefix with a candidate whose law has too few too: the host's route raises the
    # first; so does the device route, whose held expansion raises in the same round as the later one
    V = 12

    class Draft:
        vocab_size = V

        def next_dist(self, prefix):
            if len(prefix) == 2 or (len(prefix) == 1 and prefix[0] >= 4):
                return np.eye(V)[prefix[-1]]                   # one token: fewer than the ranks below it
            return np.full(V, 1.0 / V)

    q = np.exp(-np.arange(V) * 0.7)
    target = _Bank((q / q.sum())[None, :], 0)
    shape = TreeShape.branching(6, 2, 2)
    for budget, batch in ((9, 3), (12, 4), (20, 6), (30, 5)):
        host = _run(shape, "wor", Draft(), target, budget, batch, False, monkeypatch)
        dev = _run(shape, "wor", Draft(), target, budget, batch, True, monkeypatch)
        _same(host, dev)


# ----------------------------------------------------------------------------------------------- adversarial laws
def _adversarial(kind: str, V: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "subnormal":                             # most of the mass on a few tokens, the rest subnormal
        p = np.full(V, 5e-324) * rng.integers(1, 1000, V)
        p[rng.integers(V, size=3)] = rng.random(3) + 0.5
    elif kind == "near-one-hot":
        p = rng.random(V) * 1e-12
        p[rng.integers(V)] = 1.0
    elif kind == "zeros":                               # half the vocabulary at 0
        p = rng.random(V) ** 4
        p[rng.random(V) < 0.5] = 0.0
        p[rng.integers(V, size=8)] = 1.0
    elif kind == "ties":                                # a few equal values: ties in min(Q, pi) at the cut
        p = rng.choice([0.0, 1.0, 1.0, 2.0], size=V)
        p[:9] = 1.0
    else:
        return _law(kind, V, rng)
    return p / p.sum()


SHAPES = [TreeShape.branching(8, 7), TreeShape.branching(4, 3), TreeShape.branching(3, 2),
          TreeShape.branching(3, 2, 2), TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)])]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(process=st.sampled_from(["iid", "wor"]), shape=st.sampled_from(SHAPES),
       V=st.sampled_from([2, 3, 9, 40, 120, 300]),
       kinds=st.lists(st.sampled_from(["subnormal", "near-one-hot", "zeros", "ties", "one-hot", "llm", "peaked",
                                       "uniform"]), min_size=1, max_size=5),
       budget=st.sampled_from([2, 9, 64, 150]), batch=st.sampled_from([3, 8, 64]), same=st.booleans(),
       seed=st.integers(0, 2**16))
def test_torch_route_equals_numpy_route_on_adversarial_laws(process, shape, V, kinds, budget, batch, same, seed,
                                                             monkeypatch):
    _routes_agree(process, shape, V, kinds, budget, batch, same, seed, monkeypatch)


def _routes_agree(process, shape, V, kinds, budget, batch, same, seed, monkeypatch):
    """The numpy and torch routes' bounds the same (:func:`_same`) on a bank of adversarial laws (``kinds``), the
    same laws for both models (Q = pi-like ties everywhere) or the bank reversed."""
    rng = np.random.default_rng(seed)
    bank = np.stack([_adversarial(k, V, rng) for k in kinds])
    draft, target = _Bank(bank, 0), _Bank(bank if same else bank[::-1].copy(), 0 if same else 3)
    if process == "wor" and max(shape.ranks) + 1 > V:
        return
    _same(_run(shape, process, draft, target, budget, batch, False, monkeypatch),
          _run(shape, process, draft, target, budget, batch, True, monkeypatch))


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_ties_at_the_frontiers_cut(process, monkeypatch):
    # every child of the context ties in min(Q, pi): each frontier's cut falls inside a tie, and both routes take
    # the same prefixes (ties by depth, parent, token), the last depth's held unread on the device route
    V = 60
    draft = target = _Bank(np.full((1, V), 1.0 / V), 0)
    for budget in (5, 17, 64, 130):
        _same(_run(TreeShape.branching(6, 5), process, draft, target, budget, 8, False, monkeypatch),
              _run(TreeShape.branching(6, 5), process, draft, target, budget, 8, True, monkeypatch))
