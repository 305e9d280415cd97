"""The fast route of the verifier gaps of ``experiments/repro_65_trees_real.py`` against the plain one.

Its trees are drawn depth by depth for all draws of a context at once, and its bounds read the laws of one
memo shared with the drawn trees: on a float64 toy decoding pair (a bigram ``CallableLM``) the trees must be
those of ``sample_tree`` called once per draw (the same tokens, the generator left in the same state) and the
bounds those of ``otspec.tree.bound`` (same expansions, values within float64 rounding).
"""

from __future__ import annotations

import numpy as np
import pytest

from otspec.tree import TreeShape, bound, sample_tree
from tests.experiment import load_experiment

pytest.importorskip("torch")

EXACT = 1e-12
@pytest.fixture(scope="module")
def gaps():
    return load_experiment("repro_65_trees_real")


def _pair(V: int = 7, seed: int = 0):
    import torch

    from otspec.decoding import CallableLM

    gen = torch.Generator().manual_seed(seed)
    Wd = torch.randn(V, V, generator=gen, dtype=torch.float64)
    Wt = torch.randn(V, V, generator=gen, dtype=torch.float64)
    return CallableLM(lambda ids: Wd[ids], V), CallableLM(lambda ids: Wt[ids], V)


def _laws(gaps, draft, target, ctx):
    from otspec.tree._bound import _TreeAttentionLaws

    laws = gaps._ContextLaws(_TreeAttentionLaws(draft, target, ctx), {})
    return laws, gaps._LawsAt(laws, 0), gaps._LawsAt(laws, 1)


def test_trees_drawn_together_are_those_of_sample_tree_in_turn(gaps):
    draft, target = _pair()
    ctx = [3, 1]
    draws = [(TreeShape.branching(4, 2), "iid")] * 3 + [(TreeShape.branching(3, 2, 2), "wor")] * 3
    laws, dm, _ = _laws(gaps, draft, target, ctx)
    rng = np.random.default_rng(5)
    got = gaps._draw_trees(draws, dm, rng)
    _, plain, _ = _laws(gaps, draft, target, ctx)
    ref_rng = np.random.default_rng(5)
    for T, (shape, process) in zip(got, draws, strict=True):
        ref = sample_tree(shape, plain, process=process, rng=ref_rng)
        assert T.tokens.tolist() == ref.tokens.tolist()
    assert rng.bit_generator.state == ref_rng.bit_generator.state
    assert laws.calls == 1 + 3  # the root, then one call per depth for every tree (leaves included)


def test_bound_on_the_shared_laws_is_the_bound(gaps):
    draft, target = _pair(V=9, seed=1)
    ctx = [2, 4, 0]
    laws, dm, _ = _laws(gaps, draft, target, ctx)
    gaps._draw_trees([(TreeShape.branching(4, 2), "iid")] * 2, dm, np.random.default_rng(0))  # a memo in use
    for label, br, process, _vs in gaps.GAP_FAMILIES:
        shape = TreeShape.branching(*br)
        a = gaps._bound(shape, process, laws)
        b = bound(shape, draft, target, process=process, prefix=ctx, budget=gaps.GAP_BUDGET)
        assert a.n_expanded == b.n_expanded and a.complete == b.complete and a.pi_exact == b.pi_exact, label
        assert abs(a.value - b.value) <= EXACT and abs(a.remainder - b.remainder) <= EXACT, label
