"""The tree decoders' shortcuts on the CPU against the route an accelerator runs: the same draws, the same predictions.

On the CPU a read of a tensor waits for nothing, so the device route of the tree decoders reads the accepted node
before its residual (``TreeStepT.read_on_host``): the accepted node's rows of the laws are read in place (no
gathered copies, no second law of that node), the residual's level chosen on the host (one pass over ``V`` where the
route for accelerators makes two), the target's laws of EAGLE-2's slots without children left unformed (the
target-only rule never reads them; their flags taken from their logits); and the root laws kept for ``log_laws``'s
optimum are kept as logits and formed again at the flush. Every one of these must give the same draws and the same
logged predictions as the route without host reads: bit for bit with the CPU route's numba passes off
(``_PASSES_COMPILED`` False: torch's passes), and with them on (the levels' masses summed in another order, see
``_level_sums``) the same tokens and acceptances and every logged prediction within 1e-12 relative (``_same``):

* :func:`verify_tree_t` with ``host=True`` against ``host=False`` on hypothesis-made laws (sparse supports, the
  target equal to the draft: no residual mass, tied probabilities, repeated children), every rule, the target laws
  left as they were (``host=True`` runs SpecInfer's and Sequoia's rules, the walk and the accepted node's law in
  Python floats, and the residual's branch from the running sums of its draw);
* the same on whole decodes of the lossy pairings (EAGLE-2's dynamic layouts under SpecInfer's and Sequoia's rules);
* whole decodes on a tiny Llama pair (every tree family, four samplings: plain, temperature 0.7 with top-k 50,
  top-p 0.9, greedy), ``read_on_host`` on and off (on: the draws without replacement read on the host, their running
  sums continued): tokens, acceptances and every logged prediction equal;
* the root optimum from kept logits against the one from the iteration's own law blocks, four samplings;
* the flags of EAGLE-2's unformed slots (from the logits) against the flags of their formed laws, on rows with a
  NaN, a ``+inf``, every entry ``-inf``, and finite rows; and decodes with bad laws (EAGLE-2's draft and target)
  refused on both routes with the same messages.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.decoding as D  # noqa: E402
import otspec.tree as T  # noqa: E402
from otspec.decoding import _tree_device as TD  # noqa: E402
from otspec.decoding._sampling import Sampling, _laws_into, bad_rows  # noqa: E402
from otspec.decoding._tree_device import TreeLayoutT, TreeStepT, verify_tree_t  # noqa: E402
from tests.test_tree_decoding_eagle2_device import (  # noqa: E402
    test_device_eagle2_refuses_bad_laws_after_the_one_read as eagle2_refusals,
)
from tests.toy_lm import tiny_llama  # noqa: E402

torch.set_num_threads(1)
WIDE = T.TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (2, 0)])
BRANCHING_2_2 = T.TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)])
SAMPLINGS = {"plain": {}, "top-k": dict(temperature=0.7, top_k=50), "top-p": dict(top_p=0.9),
             "greedy": dict(temperature=0.0)}
TREES = ["eagle2:3,2,6", "topk:branching(2,2)", "iid:branching(2,2):specinfer", "wor:branching(2,2):sequoia",
         "iid:branching(3,2)", "wor:branching(3,1,1)", "topk:branching(3,1)"]
LOGGED = ("tokens", "accepted", "predicted_accepted", "predicted_emitted", "predicted_reached", "alpha_first",
          "alpha_opt_first")
#: What the CPU route's numba passes keep bit for bit (the draws); the logged predictions agree within PRED_RTOL.
EXACT = ("tokens", "accepted")
PRED_RTOL = 1e-12
KERNELS = [pytest.param(True, id="kernels"), pytest.param(False, id="torch-passes")]


def _kernels(on: bool, monkeypatch) -> None:
    """The CPU route's numba passes on (where compiled) or off (torch's passes, the device route's bits)."""
    if not on:
        monkeypatch.setattr(TD, "_PASSES_COMPILED", False)


def _same(name: str, got, want, kernels: bool, msg: str = "") -> None:
    """``got`` equals ``want`` bit for bit, but a logged prediction with the numba passes on: within PRED_RTOL."""
    got, want = np.asarray(got), np.asarray(want)
    if kernels and name not in EXACT:
        np.testing.assert_allclose(got, want, rtol=PRED_RTOL, atol=0, err_msg=msg)
    else:
        np.testing.assert_array_equal(got, want, err_msg=msg)


@st.composite
def _laws(draw):
    """A tree of WIDE's shape with arbitrary tokens and laws at its nodes: sparse supports (exact zeros), the target
    equal to the draft (no residual mass anywhere), tied probabilities, or both dense."""
    V = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    mode = draw(st.sampled_from(["dense", "sparse", "equal", "one-token", "ties"]))
    rng = np.random.default_rng(seed)
    n1 = WIDE.n + 1

    def laws():
        W = rng.gamma(0.5, size=(n1, V))
        if mode == "ties":  # equal probabilities and exact zeros
            W = rng.integers(0, 3, size=(n1, V)).astype(float)
            W[np.arange(n1), rng.integers(V, size=n1)] = 1.0
        if mode in ("sparse", "one-token"):
            keep = rng.random((n1, V)) < (0.5 if mode == "sparse" else 0.0)
            keep[np.arange(n1), rng.integers(V, size=n1)] = True  # at least one token of positive mass
            W = np.where(keep, W + 1e-3, 0.0)
        return W / W.sum(1, keepdims=True)

    P = laws()
    Q = P.copy() if mode == "equal" else laws()
    tokens = np.concatenate([[-1], rng.integers(V, size=WIDE.n)])
    return T.DraftTree(WIDE, WIDE.parents, tokens), P, Q, int(rng.integers(2**31))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("rule", ["specinfer", "sequoia", "target-only"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_laws())
def test_verify_reading_the_host_equals_the_device_route(rule, kernels, case):
    """verify_tree_t with the accepted node read on the host: the accepted node, the emitted token and the exact law
    bit for bit as the route without host reads (the law within 1e-12 relative with the numba passes), from the same
    generator state, and the target laws it was given bit for bit as they were (the target-only rule writes its
    residual over its row, then puts it back)."""
    tree, P, Q, seed = case
    compiled = TD._PASSES_COMPILED
    TD._PASSES_COMPILED = compiled and kernels  # (hypothesis: no function-scoped fixture)
    lay = TreeLayoutT.of_tree(tree)
    toks, Pin, Qt = torch.tensor(tree.tokens), torch.from_numpy(P[lay.inner_np]), torch.from_numpy(Q)
    Qin = Qt[torch.from_numpy(lay.inner_np)]
    before = Qin.clone()

    def q_at(v):
        return Qt.index_select(0, v)

    want = verify_tree_t(rule, lay, toks, Pin, Qin, q_at, torch.Generator().manual_seed(seed))
    try:
        got = verify_tree_t(rule, lay, toks, Pin, Qin, q_at, torch.Generator().manual_seed(seed), work={}, host=True)
    finally:
        TD._PASSES_COMPILED = compiled
    for name, a, b in zip(("tokens", "tokens", "mass"), got, want):
        _same(name, a, b, kernels)
    assert torch.equal(Qin, before)


def _decodes(target, draft, host: bool, monkeypatch, trees=TREES, **kw):
    monkeypatch.setattr(TreeStepT, "read_on_host", host)
    out = {}
    for sname, skw in SAMPLINGS.items():
        for tree in trees:
            if sname == "greedy" and tree.startswith("wor"):
                continue  # refused: greedy leaves one token, "wor" needs distinct children
            for seed in (0,):
                out[sname, tree, seed] = D.speculative_decode([3, 1, 4], draft=draft, target=target, tree=tree,
                                                              max_new_tokens=8, rng=seed, engine="torch", **skw,
                                                              **kw)
    return out


LOSSY_TREES = ["eagle2:3,2,6:specinfer", "eagle2:2,3,5:sequoia", "wor:branching(2,2):specinfer",
               "iid:branching(2,2):sequoia"]


@pytest.mark.parametrize("kernels", KERNELS)
def test_lossy_pairings_reading_the_host_equal_the_device_route(kernels, monkeypatch):
    """The rules on trees they are not lossless for (allow_lossy): EAGLE-2's dynamic layouts verified by SpecInfer's and
    Sequoia's rules (the Python-float rules on a layout made per iteration), the draws without replacement verified by
    SpecInfer's rule and the i.i.d. draws by Sequoia's: the host route as the route without host reads (``_same``)."""
    _kernels(kernels, monkeypatch)
    target, draft = tiny_llama(1, vocab=60), tiny_llama(2, vocab=60)
    got = {}
    for host in (True, False):
        monkeypatch.setattr(TreeStepT, "read_on_host", host)
        got[host] = {(tree, sname): D.speculative_decode([3, 1, 4], draft=draft, target=target, tree=tree,
                                                         max_new_tokens=10, rng=2, engine="torch", allow_lossy=True,
                                                         **skw)
                     for tree in LOSSY_TREES for sname, skw in SAMPLINGS.items()
                     if not (sname == "greedy" and tree.startswith(("wor", "eagle2:2")))}
    for key, res in got[True].items():
        for name in LOGGED:
            _same(name, getattr(res, name), getattr(got[False][key], name), kernels, f"{key} {name}")


#: One tree of each family (EAGLE-2, top-k, i.i.d. with SpecInfer, without replacement with Sequoia) in the default
#: suite; the wider and deeper trees of the same families (three root children, depth 3) under ``-m slow``.
FAMILY_TREES = TREES[:4]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("trees", [pytest.param(FAMILY_TREES, id="families"),
                                   pytest.param(TREES[4:], id="wider-deeper", marks=pytest.mark.slow)])
def test_whole_decodes_reading_the_host_equal_the_device_route(kernels, trees, monkeypatch):
    """Whole decodes of every tree family under four samplings on a tiny Llama pair: reading the accepted node on
    the host (the CPU's default) gives the tokens and the acceptances bit for bit as the route without host reads,
    and every logged prediction bit for bit (torch's passes) or within 1e-12 relative (the numba passes)."""
    _kernels(kernels, monkeypatch)
    target, draft = tiny_llama(1, vocab=60), tiny_llama(2, vocab=60)
    on = _decodes(target, draft, True, monkeypatch, trees)
    off = _decodes(target, draft, False, monkeypatch, trees)
    assert on.keys() == off.keys()
    for key in on:
        for name in LOGGED:
            _same(name, getattr(on[key], name), getattr(off[key], name), kernels, f"{key} {name}")


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_root_optimum_from_kept_logits_equals_the_one_from_the_laws(process, monkeypatch):
    """log_laws' root optimum from the root logits kept in blocks of law_batch rows (their laws formed again at the
    flush) equals, bit for bit, the one from the iteration's own law blocks, under four samplings; the tokens too."""
    from otspec.decoding import _loop

    target, draft = tiny_llama(3, vocab=40), tiny_llama(4, vocab=40)
    for sname, skw in SAMPLINGS.items():
        if process == "wor" and sname == "greedy":
            continue
        kw = dict(draft=draft, target=target, tree=BRANCHING_2_2, process=process, max_new_tokens=14, rng=5,
                  engine="torch", **skw)
        monkeypatch.setattr(TreeStepT, "copy_root_laws", False)
        own = D.speculative_decode([2, 7], **kw)
        monkeypatch.setattr(TreeStepT, "copy_root_laws", True)
        monkeypatch.setattr(_loop, "LAW_BATCH", 3)  # full flushes, then the rest after the loop
        kept = D.speculative_decode([2, 7], **kw)
        np.testing.assert_array_equal(kept.tokens, own.tokens, err_msg=sname)
        np.testing.assert_array_equal(kept.alpha_opt_first, own.alpha_opt_first, err_msg=sname)
        drafted = kept.draft_lengths > 0  # plain decoding's step (one token left) has none: NaN
        assert np.isfinite(kept.alpha_opt_first[drafted]).all() and len(kept.alpha_opt_first) == kept.iterations
        assert np.isnan(kept.alpha_opt_first[~drafted]).all()


def test_unformed_slots_flag_bad_logits_as_their_laws_would():
    """The flags of slots whose target law is not formed, taken from their logits, equal bad_rows of the plain law
    formed from the same logits: rows with a NaN, a +inf, every entry -inf, some -inf, and finite rows."""
    V = 7
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, V, generator=g)
    logits[1, 3] = float("nan")
    logits[2, 0] = float("inf")
    logits[3] = -float("inf")
    logits[4, :5] = -float("inf")
    step = TreeStepT.__new__(TreeStepT)
    step.sampling, step._blocks = Sampling(), {}
    rows = torch.tensor([0, 1, 2, 3, 4, 5])
    formed = [True, False, False, False, False, False]
    Q, _, _ = step._target_laws(logits, rows, host=True, formed=formed)
    got = step._target_flags(Q, logits, rows, formed)
    want = bad_rows(_laws_into(Sampling(), logits, torch.empty(6, V, dtype=torch.float64))).to(torch.long)
    assert got.tolist() == want.tolist() == [0, 1, 1, 1, 0, 0]
    full, _, _ = step._target_laws(logits, rows, host=True)
    assert torch.equal(Q[0], full[0])


@pytest.mark.parametrize("host", [True, False])
def test_eagle2_bad_laws_refused_on_both_routes(host, monkeypatch):
    """Non-finite draft or target logits and a draft support too small: the same ValueErrors (the model and the
    position; the node's token path) whether the slots' target laws are formed lazily (host reads) or all of them
    (tests/test_tree_decoding_eagle2_device.py's refusals, run on both routes)."""
    monkeypatch.setattr(TreeStepT, "read_on_host", host)
    eagle2_refusals()
