"""Tree drafting and verification on the device route in fewer ops: the same values and draws bit for bit.

Independent routes:

* :func:`otspec.decoding._tree_device.node_rules_t` with ``reach_only`` (the profile's call: no ``alive``, level or
  sampler, SpecInfer's levels ungated past each node's last child, its acceptances unmasked there) against the full
  call and against the loop over siblings it replaced (``tests/test_profile_node_rules.py``'s ``_sibling_loop``);
* :func:`otspec.decoding._tree_device.end_mass_t` by one gather of every depth's factors (a :class:`TreeLayoutT`'s
  ``ancestors``) against the pass per depth written out here, with and without ``alive``;
* :func:`otspec.decoding._tree_device._draws_from_sums` (one search, the uniform rounded up to the total lowered to
  the float below it) against the two searches written out here, on rows with zeros, a uniform landing on the total,
  a zero row and a NaN row; several generators' uniforms joined against one draw per generator;
* the sampled trees the device route draws (the i.i.d. draws of every prompt in one search) against the tokens the
  code before this change drew with the same seeds (recorded below).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import otspec.decoding._tree_device as TD  # noqa: E402
from otspec.decoding._tree_device import Eagle2LayoutT, TreeLayoutT, end_mass_t, node_rules_t  # noqa: E402
from tests.test_profile_node_rules import _bits_equal, _law, _sibling_loop, _trees  # noqa: E402


def _mass_by_depths(lay, acc, alive):
    """The law of the accepted node by one pass per depth (the route before the gather of every depth's factors)."""
    reach = torch.ones_like(acc)
    for nodes, par in lay.levels:
        reach = reach.index_copy(0, nodes, reach.index_select(0, par) * acc.index_select(0, nodes))
    return reach * alive


@pytest.mark.parametrize("rule", ["specinfer", "sequoia", "target-only"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_trees())
def test_reach_only_rules_and_the_gathered_mass_are_the_full_routes_bit_for_bit(rule, case):
    lay, tokens, P, Q = case
    acc, alive, x, level, sampler = node_rules_t(rule, lay, tokens, P, Q)
    got, none_alive, gx, none_level, none_sampler = node_rules_t(rule, lay, tokens, P, Q, reach_only=True)
    assert none_alive is None and none_level is None and none_sampler is None
    assert _bits_equal(got, acc) and torch.equal(gx, x)
    if rule != "target-only":  # the loop over siblings (no target-only rule there)
        assert _bits_equal(got, _sibling_loop(rule, lay, tokens, P, Q)[0])
    ones = torch.ones_like(alive)
    assert _bits_equal(end_mass_t(lay, got, None), _mass_by_depths(lay, acc, ones))
    assert _bits_equal(end_mass_t(lay, acc, alive), _mass_by_depths(lay, acc, alive))
    assert _bits_equal(end_mass_t(lay, acc, ones), end_mass_t(lay, acc, None))


def test_ancestors_of_a_forest_are_each_depths_ancestor_or_the_root():
    # two trees side by side (the profile's forests): node 7's ancestors at depths 1, 2, 3 are 5, 6, 7; node 1's
    # (depth 1) are 1, then its root 0 twice; a root is its own root at every depth
    parents = [-1, 0, 0, 1, -1, 4, 5, 6]
    depth = [0, 1, 1, 2, 0, 1, 2, 3]
    lay = TreeLayoutT(parents, depth, [0, 1, 4, 5, 6], "cpu")
    anc = lay.ancestors.tolist()
    assert [row[7] for row in anc] == [5, 6, 7]
    assert [row[1] for row in anc] == [1, 0, 0] and [row[3] for row in anc] == [1, 3, 0]
    assert [row[4] for row in anc] == [4, 4, 4] and [row[0] for row in anc] == [0, 0, 0]


@pytest.mark.parametrize("rule", ["specinfer", "sequoia", "target-only"])
def test_reach_only_on_eagle2_rows_without_children(rule):
    """An EAGLE-2 layout (no ancestors: the pass per depth) with rows of no child and a dump entry."""
    parents = torch.tensor([-1, 0, 0, 1, 1, 3])
    depth = torch.tensor([0, 1, 1, 2, 2, 3])
    slot_node = torch.tensor([0, 1, 2, -1, 3, -1, -1])
    kids = torch.tensor([[1, 2], [3, 4], [-1, -1], [-1, -1], [5, -1], [-1, -1], [-1, -1]])
    lay = Eagle2LayoutT(parents, depth, slot_node, kids, 3)
    rng = np.random.default_rng(5)
    for mode in ("dense", "ties", "sparse"):
        P = torch.from_numpy(np.stack([_law(rng, 5, mode) for _ in range(7)]))
        Q = torch.from_numpy(np.stack([_law(rng, 5, mode) for _ in range(7)]))
        tokens = torch.tensor([0, 1, 1, 2, 2, 4])
        acc, alive, *_ = node_rules_t(rule, lay, tokens, P, Q)
        got = node_rules_t(rule, lay, tokens, P, Q, reach_only=True)[0]
        assert _bits_equal(got, acc)
        assert _bits_equal(end_mass_t(lay, got, None), _mass_by_depths(lay, acc, torch.ones_like(alive)))


def _two_searches(c, u):
    """The draws before: the first running sum above ``u`` times the total, else the first reaching the total."""
    tot = c[:, -1:].contiguous()
    i = torch.searchsorted(c, u * tot, right=True)
    top = torch.searchsorted(c, tot, right=False)
    return torch.where(i < c.shape[-1], i, top).clamp_(max=c.shape[-1] - 1)


def _rows(rng, n, V):
    P = rng.random((n, V)) * (rng.random((n, V)) < 0.6)
    P[:, rng.integers(V)] += 0.25
    return P


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(1, 30), n=st.integers(1, 5), k=st.integers(1, 4))
def test_one_search_draws_as_the_two_did(seed, V, n, k):
    rng = np.random.default_rng(seed)
    P = torch.from_numpy(_rows(rng, n, V))
    c = torch.cumsum(P, dim=-1)
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    got = TD._draws_from_sums(c, k, g1)
    u = torch.rand((n, k), dtype=torch.float64, generator=g2)
    assert torch.equal(got, _two_searches(c, u))
    assert torch.equal(g1.get_state(), g2.get_state())  # the same uniforms taken from the generator
    # uniforms landing on the total (u * c_V rounds to c_V), at 0, and at every running sum
    edge = torch.tensor([1.0 - 2.0**-53, 0.0, 0.5], dtype=torch.float64).repeat(n, 1)
    edge = torch.cat([edge, (c / c[:, -1:]).clamp(max=1.0 - 2.0**-53)], 1)
    assert torch.equal(TD._draws_from_sums(c, edge.shape[1], None, u=edge), _two_searches(c, edge))


def test_one_search_on_a_zero_row_a_nan_row_and_a_total_of_trailing_zeros():
    P = torch.tensor([[0.0, 0.0, 0.0], [math.nan] * 3, [0.0, 0.3, 0.0], [1.0, 2.0**-60, 0.0]], dtype=torch.float64)
    c = torch.cumsum(P, dim=-1)
    u = torch.tensor([0.0, 0.3, 1.0 - 2.0**-53], dtype=torch.float64).repeat(4, 1)
    got = TD._draws_from_sums(c, 3, None, u=u)
    assert torch.equal(got, _two_searches(c, u))
    assert got[0].tolist() == [0, 0, 0] and got[1].tolist() == [2, 2, 2]  # a NaN row: an id still
    assert got[2].tolist() == [1, 1, 1] and got[3, 2] == 0  # the total reached at token 0 (2**-60 is absorbed)


def test_joined_uniforms_draw_as_each_generator_alone():
    # the profile's sampled trees: each prompt's rows drawn with its own generator's uniforms, the searches joined
    rng = np.random.default_rng(2)
    P = torch.from_numpy(_rows(rng, 7, 11))
    runs = [(0, 3), (3, 4), (4, 7)]
    gens = [torch.Generator().manual_seed(s) for s in (5, 6, 7)]
    alone = [TD._draws(P[a:e], 4, torch.Generator().manual_seed(s)) for (a, e), s in zip(runs, (5, 6, 7))]
    u = torch.cat([torch.rand((e - a, 4), dtype=torch.float64, generator=g) for (a, e), g in zip(runs, gens)])
    joined = TD._draws_from_sums(torch.cumsum(P, dim=-1), 4, None, u=u)
    assert torch.equal(joined, torch.cat(alone))


#: The tokens the device route drew before its i.i.d. draws were joined over prompts (commit c435899), for the three
#: prompts of ``tests/test_profile_trees_device.py``'s batch test (``toy_pair(6, seed=3)``, seed 4).
DRAWN = {
    0: {"iid:[[0],[1],[0,0],[0,1],[0,0,0]]": [-1, 4, 3, 1, 2, 3], "iid:branching(3,2)": [-1, 3, 0, 4, 4, 0, 4, 5, 1, 2],
        "wor:[[0],[1],[0,0],[1,0],[1,1],[0,0,0]]": [-1, 4, 0, 2, 4, 5, 1], "wor:[[0],[2],[0,0],[2,1]]": [-1, 3, 5, 0, 4],
        "wor:branching(3)": [-1, 1, 4, 5]},
    1: {"iid:[[0],[1],[0,0],[0,1],[0,0,0]]": [-1, 5, 4, 0, 1, 2], "iid:branching(3,2)": [-1, 1, 0, 0, 3, 3, 4, 4, 5, 1],
        "wor:[[0],[1],[0,0],[1,0],[1,1],[0,0,0]]": [-1, 3, 1, 0, 3, 4, 0], "wor:[[0],[2],[0,0],[2,1]]": [-1, 4, 0, 5, 2],
        "wor:branching(3)": [-1, 1, 4, 5]},
    2: {"iid:[[0],[1],[0,0],[0,1],[0,0,0]]": [-1, 4, 4, 2, 3, 1], "iid:branching(3,2)": [-1, 5, 4, 5, 1, 4, 5, 2, 2, 1],
        "wor:[[0],[1],[0,0],[1,0],[1,1],[0,0,0]]": [-1, 5, 2, 4, 1, 5, 5], "wor:[[0],[2],[0,0],[2,1]]": [-1, 1, 5, 4, 1],
        "wor:branching(3)": [-1, 4, 2, 5]},
}


def test_the_device_drawn_trees_are_the_old_codes_bit_for_bit():
    pytest.importorskip("transformers")
    from otspec.profile import toy_pair
    from otspec.profile._trees import resolve_trees
    from tests.test_profile_trees_device import SAMPLED, _at

    draft, target = toy_pair(6, seed=3)
    got = _at(draft, target, [[1, 3], [2, 2], [5, 0]], resolve_trees(SAMPLED), seed=4)
    assert {b: {label: s.tree.tokens.tolist() for label, s in g.items()} for b, g in enumerate(got)} == DRAWN
