"""The bound's torch route on deeper shapes: the reads of every shape pinned, the declined rows in one read.

Where :func:`otspec.tree._bound._wor_pi_steps` declines a depth's rows (draws enumerated on a small support, the
race refused after its head grew to the whole row, or off), :func:`otspec.tree._bound._expand_t_steps` reads their
laws in one copy and expands them by the host's route (:func:`otspec.tree._bound._host_route_steps`: the numpy
route's own function on the same rows), instead of the host's block route on the tensors, which read a few times
per rank and field (``branching(16, 4)`` without replacement at V = 3,000: 39 reads, now 8). Where every row's
draws are enumerated whatever its support (``perm(V, need) * V`` at most the enumeration's limit) it declines before
the race's power sums (one read fewer). Checked here: the reads of one bound per shape and process (pinned; the
code before, commit 24cd376, fails the without-replacement pins of ``branching(16, 4)`` and of the small
vocabularies), the declined bound equal to the numpy route to the bit, and the torch route against the numpy route
on adversarial laws at deeper shapes (values to 1e-12, the same prefixes in the same order, the same errors).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import otspec.tree._bound as B  # noqa: E402
from otspec.tree import TreeShape  # noqa: E402
from tests.test_profile_host_reads import HostReads  # noqa: E402
from tests.test_tree_bound_device import _Bank, _Laws, _pair  # noqa: E402
from tests.test_tree_bound_reads_bh import _routes_agree, _run, _same  # noqa: E402

SHAPES = {"(8,7)": TreeShape.branching(8, 7), "(4,3,2)": TreeShape.branching(4, 3, 2),
          "(2,2,2,2)": TreeShape.branching(2, 2, 2, 2), "(16,4)": TreeShape.branching(16, 4),
          "chains(3,4)": TreeShape.chains(3, 4)}

#: Host reads of one bound (budget 256, 64 a call: 5 calls), measured. i.i.d.: one read per call with a depth that
#: has candidates (the next frontier's paths go to the models from the host), the last expanded depth's read with
#: later rounds (branching(8, 7), (16, 4): 2). Without replacement two per call whose rows need the race (its power
#: sums, then the values: the quadrature runs on the host between them), one where no depth needs it
#: ((2,2,2,2); chains(3, 4) needs it at the context only). branching(16, 4): the context's race grows its head
#: (one read a growth) and at V = 3,000 is refused: its row then read once for the host's route (the code before:
#: 37 and 39 reads, the host's block route on the tensors). Since its grown heads are read together (one read for
#: every growth of the same rows, otspec.tree._bound._GrownHeads; tests/test_tree_bound_race_reads_bq.py): 5 and 5
#: (6 and 8 before); since the laws of a race refused after its last growth come with its heads
#: (tests/test_tree_bound_reads_bv.py): 4 and 4.
READS = {
    300: {"(8,7)": (2, 4), "(4,3,2)": (5, 10), "(2,2,2,2)": (5, 5), "(16,4)": (2, 4), "chains(3,4)": (5, 6)},
    3000: {"(8,7)": (2, 4), "(4,3,2)": (5, 10), "(2,2,2,2)": (5, 5), "(16,4)": (2, 4), "chains(3,4)": (5, 6)},
}


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("V", [300, 3000])
def test_reads_of_one_bound_per_shape(name, V):
    draft, target = _pair(V, ["llm", "peaked", "llm"], 5)
    for process, want in zip(("iid", "wor"), READS[V][name]):
        laws = _Laws(draft, target, True)
        with HostReads() as mode:
            got = B._sampled(B._Slots(SHAPES[name]), process, laws, 256, 64)
        assert laws.calls == got.n_calls == 5
        assert len(mode.reads) == want, (process, mode.reads)


@pytest.mark.parametrize(("V", "dims", "seed", "reads", "calls"),
                         [(40, (3, 3, 3, 2), 7, 12, 6), (8, (3, 3, 3), 7, 3, 3), (12, (3, 3, 3), 1, 3, 4)])
def test_reads_where_the_rows_are_declined(V, dims, seed, reads, calls, monkeypatch):
    # V = 40: rows whose draws are enumerated (small supports) found by the race's power sums' read, then read once
    # for the host's route: two reads a call (the code before: 138). V = 8, 12: every row enumerated whatever its
    # support, declined before any read: one read a call (the last depth's with later rounds); the code before 2
    # and more a call
    draft, target = _pair(V, ["llm", "peaked", "llm"], seed)
    shape = TreeShape.branching(*dims)
    dev = _run(shape, "wor", draft, target, 256, 64, True, monkeypatch)
    assert (dev[2], dev[0].n_calls) == (reads, calls)
    host = _run(shape, "wor", draft, target, 256, 64, False, monkeypatch)
    _same(host, dev, bits=V <= 12)     # every depth declined: the numpy route's own arithmetic, to the bit


def test_a_refused_race_is_the_numpy_routes_to_the_bit(monkeypatch):
    # the race off: every depth with ranks >= 2 declined, each read once and expanded by the numpy route's own
    # function, the one depth without them (need 2, here none) on the device; branching(3, 3, 3) needs the race
    # at every depth, so the whole bound is the numpy route's to the bit (the code before: the host's block
    # route on the tensors, torch's sums, in many reads)
    monkeypatch.setattr(B, "_WOR_RACE", False)
    draft, target = _pair(300, ["llm", "peaked", "ties", "llm"], 3)
    shape = TreeShape.branching(3, 3, 3)
    dev = _run(shape, "wor", draft, target, 256, 64, True, monkeypatch)
    host = _run(shape, "wor", draft, target, 256, 64, False, monkeypatch)
    _same(host, dev, bits=True)
    assert (dev[2], dev[0].n_calls) == (5, 5)      # one read a call (the code before: 80)


def test_a_declined_rows_support_error_is_the_hosts():
    # a prefix whose draft law has fewer tokens than the ranks below it, at a small vocabulary (declined before any
    # read): the host's route raises, naming the prefix, as the numpy route does
    V = 8

    class Draft:
        vocab_size = V

        def next_dist(self, prefix):
            return np.eye(V)[prefix[-1]] if len(prefix) == 1 and prefix[0] == 2 else np.full(V, 1.0 / V)

    target = _Bank(np.full((1, V), 1.0 / V), 0)
    msgs = []
    for as_tensor in (False, True):
        with pytest.raises(ValueError) as err:
            B._sampled(B._Slots(TreeShape.branching(4, 3)), "wor", _Laws(Draft(), target, as_tensor), 64, 64)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1] and "(2,)" in msgs[0]


DEEP = [TreeShape.branching(4, 3, 2), TreeShape.branching(2, 2, 2, 2), TreeShape.branching(16, 4),
        TreeShape.branching(3, 3, 3), TreeShape.chains(3, 4), TreeShape.chains(1, 5)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(process=st.sampled_from(["iid", "wor"]), shape=st.sampled_from(DEEP),
       V=st.sampled_from([2, 3, 5, 8, 17, 40, 120, 300]),
       kinds=st.lists(st.sampled_from(["subnormal", "near-one-hot", "zeros", "ties", "one-hot", "llm", "peaked",
                                       "uniform"]), min_size=1, max_size=5),
       budget=st.sampled_from([2, 9, 64, 150]), batch=st.sampled_from([3, 8, 64]), same=st.booleans(),
       seed=st.integers(0, 2**16))
@example(process="iid", shape=TreeShape.branching(4, 3, 2), V=17, kinds=["near-one-hot", "subnormal", "subnormal",
         "subnormal"], budget=2, batch=3, same=False, seed=1)  # a remainder that cancelled (test_tree_bound_routes_ck)
def test_torch_route_equals_numpy_route_at_deeper_shapes(process, shape, V, kinds, budget, batch, same, seed,
                                                         monkeypatch):
    _routes_agree(process, shape, V, kinds, budget, batch, same, seed, monkeypatch)


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("dims", [(4, 3, 2), (3, 3, 3)])
def test_ties_at_the_frontiers_cut_at_deeper_shapes(process, dims, monkeypatch):
    # uniform laws: every child ties in min(Q, pi), each frontier's cut falls inside a tie (the numpy route takes
    # them by depth, parent, token; so must the torch route)
    for V in (9, 60):
        draft = target = _Bank(np.full((1, V), 1.0 / V), 0)
        for budget, batch in ((5, 8), (17, 8), (64, 7), (130, 64)):
            _same(_run(TreeShape.branching(*dims), process, draft, target, budget, batch, False, monkeypatch),
                  _run(TreeShape.branching(*dims), process, draft, target, budget, batch, True, monkeypatch))
