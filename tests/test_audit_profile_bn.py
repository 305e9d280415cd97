"""Audit of the profile's device route against its numpy route with other seeds, sizes and inputs (task BN).

The whole walk of a pair of random-weight tiny Llamas (tests/toy_lm.py) on the device route (torch CPU tensors standing
in for a GPU's: :func:`otspec.profile._collect.analysis_device` patched; the sampled trees drawn from the host's stream)
and on the numpy route: every row (chains, sampled and deterministic tree families, the tree bound on either of its
routes, the renewal tables) recorded with the same keys and values within 1e-12 relative (the bound's remainder within
1e-12 of max(1, value)). Cases: other seeds and vocabularies (2 to 300), one, two and five prompts walked together,
strides 1 to 3, k_max and L_max from 1 to 4, trees on and off, and a draft whose laws are uniform (every draft
probability tied: the bound's candidates of equal pi, which the routes ordered by bits a few ulp apart before
otspec.tree._bound._order_key).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.profile._collect as C  # noqa: E402
import otspec.profile._tree_bound as TB  # noqa: E402
import otspec.profile._trees_device as TD  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from otspec.profile._renewal_hook import emission_rows  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

TREES = ("iid:branching(3,2):specinfer,target-only", "wor:[[0],[1],[0,0],[1,0],[1,1],[0,0,0]]:sequoia,target-only",
         "topk:branching(2,2)", "wor:branching(2,2):sequoia,traversal")
NAMES = dict(verifiers=["token", "optimal", "kseq", "multiround"], families=["token", "block", "block-onestep", "kseq"])


def _rows(monkeypatch, draft, target, prompts, V, device, kw, bound_on_device) -> dict:
    """``{(prompt, pos, kind, name, k, j, m): value}`` of one walk (timing rows left out)."""
    s = ProfileSettings(**kw).for_vocabulary(V)
    with monkeypatch.context() as m:
        m.setattr(C, "analysis_device", lambda lm: device)
        m.setattr(TB, "BOUND_ON_DEVICE", bound_on_device)
        if device is not None:
            m.setattr(TD, "device_generator", lambda rngs, device: None)
        B = len(prompts)
        if B == 1:
            got = [C.profile_prompt(draft, target, prompts[0], None, s, 0, renewal=emission_rows)]
        else:
            got = C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)), renewal=emission_rows)
    out = {}
    for r in got:
        for i in range(len(r["kind"])):
            if r["kind"][i] in C.TIMING_KINDS:
                continue
            key = tuple(r[c][i] for c in ("prompt", "pos", "kind", "name", "k", "j", "m"))
            assert key not in out, key
            out[key] = r["value"][i]
    return out


def _agree(monkeypatch, draft, target, prompts, V, kw, bound_on_device):
    host = _rows(monkeypatch, draft, target, prompts, V, None, kw, bound_on_device)
    dev = _rows(monkeypatch, draft, target, prompts, V, torch.device("cpu"), kw, bound_on_device)
    assert dev.keys() == host.keys()
    for key, a in host.items():
        b = dev[key]
        if a != a:
            assert b != b, key
            continue
        scale = max(abs(a), 1.0) if key[2] == TB.BOUND_KIND else abs(a)
        assert abs(a - b) <= 1e-12 * scale, (key, a, b)
    return host


# (seed, V, B, k_max, L_max, subsample, trees, bound_budget, bound on device), from the audit's random walks
CASES = [
    (3, 2, 1, 1, 1, 1, None, None, False),
    (11, 5, 5, 2, 3, 2, None, None, False),
    (17, 17, 2, 4, 1, 3, None, None, False),
    (23, 64, 5, 1, 4, 0, None, None, False),
    (29, 3, 2, 2, 2, 1, TREES[:2], 5, True),
    (31, 64, 5, 1, 2, 2, TREES[2:4], 16, False),
    (37, 300, 2, 3, 2, 1, TREES[1::2], 1, True),
]


@pytest.mark.parametrize(("seed", "V", "B", "k_max", "L_max", "sub", "trees", "budget", "on_device"), CASES)
def test_device_walk_equals_the_numpy_walk(monkeypatch, seed, V, B, k_max, L_max, sub, trees, budget, on_device):
    rng = np.random.default_rng(seed)
    kw = dict(k_max=k_max, L_max=L_max, max_new_tokens=2, subsample=sub, batch_size=B, **NAMES)
    if trees:
        kw.update(trees=list(trees), bound_budget=budget)
    draft, target = tiny_llama(seed, vocab=V), tiny_llama(seed + 1, vocab=V)
    prompts = [[int(t) for t in rng.integers(0, V, int(rng.integers(1, 5)))] for _ in range(B)]
    rows = _agree(monkeypatch, draft, target, prompts, V, kw, on_device)
    if trees:
        assert any(key[2] == TB.BOUND_KIND for key in rows)


@pytest.mark.parametrize("on_device", [False, True])
def test_a_uniform_draft_gives_the_same_tree_bound_on_both_routes(monkeypatch, on_device):
    # the draft's output layer zeroed: every draft law uniform, every child of a node the same pi; the bound's budget
    # cuts through those ties (found by this audit: the routes' bounds differed by 1e-4 to 1e-2 before _order_key)
    V = 50
    draft, target = tiny_llama(5, vocab=V), tiny_llama(6, vocab=V)
    with torch.no_grad():
        draft.model.lm_head.weight.zero_()
    kw = dict(k_max=1, L_max=1, max_new_tokens=2, subsample=1, batch_size=2, verifiers=["token"], families=["token"],
              trees=["wor:[[2],[2,0]]:target-only", "wor:[[4],[5],[5,3],[5,5],[5,3,4]]:target-only"], bound_budget=11)
    rows = _agree(monkeypatch, draft, target, [[3, 7, 1], [5, 2]], V, kw, on_device)
    assert sum(key[2] == TB.BOUND_KIND for key in rows) > 0
