"""check_tree_sampler: the package's tree verifiers pass, lossy rules are flagged with their exact TV, and
SGLang's tree verification kernel (re-implemented on CPU with its signature) is tested through its arrays.

False-failure budget: every check of a correct sampler runs at alpha_fail = 1e-4 with a fixed seed; there are
9 of them (union bound: this file fails spuriously with probability <= 9e-4 over seeds; the seeds are fixed,
so the outcome is deterministic). A lossy rule is checked at a TV below its exact TV (computed by enumeration
of the realised trees), where the test detects it with probability >= 0.99.
"""

import functools

import numpy as np
import pytest

from otspec.models import MemorylessModel, joint_law, random_table_model
from otspec.testing import (
    StepError,
    check_tree_sampler,
    from_sglang_kernel,
    sglang_tree_arrays,
    tree_from_sglang,
)
from otspec.tree import (
    DraftTree,
    Eagle2Params,
    SequoiaVerifier,
    SpecInferVerifier,
    TargetOnlyVerifier,
    TreeShape,
    TreeVerifier,
    check_lossless,
    enumerate_trees,
    output_law,
    sample_tree,
    tree_laws,
    value,
)

ALPHA = 1e-4
V = 3
DRAFT = random_table_model(V, 3, rng=29)
TARGET = random_table_model(V, 3, rng=129)
TARGET_ZEROS = random_table_model(V, 3, support=2, rng=7)  # each conditional on 2 of the 3 tokens
SHAPE = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)])


def tv(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------
# the package's tree verifiers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("verifier,process", [(SpecInferVerifier(), "iid"), (SequoiaVerifier(), "wor"),
                                              (TargetOnlyVerifier(), "topk")])
def test_package_tree_verifiers_pass_with_boundary_coins(verifier, process):
    res = check_tree_sampler(verifier, SHAPE, DRAFT, TARGET_ZEROS, process=process, tv=0.1, boundary_coins=True,
                             rng=1)
    assert res.passed, res.message
    assert res.n_boundary == res.n_samples and not res.boundary_vacuous
    assert res.max_depth == 2 and res.law.shape == (V**3,) and res.process == process


def test_mean_accepted_estimates_the_exact_value():
    res = check_tree_sampler(SpecInferVerifier(), SHAPE, DRAFT, TARGET, process="iid", tv=0.06, rng=2)
    exact = value(SHAPE, DRAFT, TARGET, process="iid", verifier="specinfer")
    assert res.passed
    assert res.n_trees == len(enumerate_trees(SHAPE, DRAFT, process="iid")) == 3**5
    assert abs(res.mean_accepted - exact) < 4.5 * res.accepted_se  # two-sided, probability 7e-6 to fail


def test_a_rule_on_the_wrong_draft_process_is_flagged_with_its_tv():
    # SpecInfer's rule (drafts with replacement) on trees drawn without replacement
    exact = tv(output_law(SHAPE, DRAFT, TARGET, process="wor", verifier="specinfer"), joint_law(TARGET, 3))
    assert exact > 0.07
    res = check_tree_sampler(SpecInferVerifier(), SHAPE, DRAFT, TARGET, process="wor", tv=0.75 * exact, rng=3)
    assert not res.passed and res.outside_support == 0
    assert res.tv_estimate == pytest.approx(exact, abs=res.detectable_tv)
    worst = res.worst_cells[0]
    assert abs(worst.residual) > 4 and str(worst.cell) in res.message
    cell = np.ravel_multi_index(worst.cell, (V,) * 3)
    assert worst.expected == res.target_law[cell] * res.n_samples and worst.observed == res.law[cell] * res.n_samples


def test_prefix_and_eagle2_trees():
    draft, target = random_table_model(V, 4, rng=5), random_table_model(V, 4, rng=6)
    res = check_tree_sampler(TargetOnlyVerifier(), Eagle2Params(depth=2, top_k=2, total_tokens=5), draft, target,
                             process="eagle2", prefix=(2,), tv=0.1, rng=4)
    assert res.passed, res.message
    exact = check_lossless("target-only", TreeShape([(0,), (0, 0)]), draft, target, process="topk", prefix=(2,))
    np.testing.assert_allclose(res.target_law, exact.target_law.reshape(-1), rtol=0, atol=1e-15)
    assert abs(res.target_law - joint_law(target, 3).reshape(-1)).max() > 0.05  # the context matters here


def test_same_seed_same_result():
    a, b = (check_tree_sampler(SequoiaVerifier(), SHAPE, DRAFT, TARGET, process="wor", tv=0.2, rng=7)
            for _ in range(2))
    np.testing.assert_array_equal(a.law, b.law)
    assert a.pvalue == b.pvalue and a.mean_accepted == b.mean_accepted
    assert repr(a).startswith("TreeSamplerCheck(passed=True (no deviation") and "array" not in repr(a)


# ---------------------------------------------------------------------------
# input validation and misbehaving steps
# ---------------------------------------------------------------------------


def test_inputs_are_validated_before_any_trial():
    calls = []

    def step(tree, P, Q, rng):
        calls.append(1)
        return 0, 0

    with pytest.raises(TypeError, match="`step`"):
        check_tree_sampler(3, SHAPE, DRAFT, TARGET, process="iid")
    with pytest.raises(ValueError, match="`process`"):
        check_tree_sampler(step, SHAPE, DRAFT, TARGET, process="beam")
    with pytest.raises(TypeError, match="`shape`"):
        check_tree_sampler(step, Eagle2Params(2, 2, 4), DRAFT, TARGET, process="iid")
    with pytest.raises(ValueError, match="MAX_ENUMERATION"):
        deep = TreeShape.chains(1, 14)
        check_tree_sampler(step, deep, DRAFT, TARGET, process="topk")
    with pytest.raises(ValueError, match="`max_trees`"):
        check_tree_sampler(step, SHAPE, DRAFT, TARGET, process="iid", max_trees=100)
    with pytest.raises(ValueError, match="`tv`"):
        check_tree_sampler(step, SHAPE, DRAFT, TARGET, process="iid", tv=0.0)
    with pytest.raises(ValueError, match="`prefix`"):
        check_tree_sampler(step, SHAPE, DRAFT, TARGET, process="iid", prefix=(5,))
    with pytest.raises(TypeError, match="`boundary_coins`"):
        check_tree_sampler(step, SHAPE, DRAFT, TARGET, process="iid", boundary_coins=1)
    assert not calls


@pytest.mark.parametrize("out,match", [
    ((0,), "must return \\(node, token\\)"), ((0, 1.0), "two ints"), ((9, 0), "returned node 9"),
    ((0, 3), "returned token 3"), (np.array([0, 1, 2]), "must return"), ("ab", "must return"),
])
def test_bad_outputs_raise_step_errors_naming_the_tree(out, match):
    with pytest.raises(StepError, match=match) as err:
        check_tree_sampler(lambda t, P, Q, rng: out, SHAPE, DRAFT, TARGET, process="topk", n_samples=50, rng=0)
    topk = sample_tree(SHAPE, DRAFT, process="topk")
    assert err.value.phase == "frequency" and err.value.drafts == tuple(topk.paths()[1:])
    assert str(err.value.drafts) in str(err.value)


def test_tensor_and_array_outputs_are_accepted(torch):
    ref = TargetOnlyVerifier()

    def step(tree, P, Q, rng):
        node, tok = ref.sample(tree, P, Q, rng=rng)
        return torch.tensor([node, tok]) if rng.random() < 0.5 else np.array([node, tok])

    assert check_tree_sampler(step, SHAPE, DRAFT, TARGET, process="topk", tv=0.15, rng=8).passed


def test_a_step_that_raises_or_writes_its_inputs_is_reported():
    def boom(tree, P, Q, rng):
        raise KeyError("no")

    with pytest.raises(StepError, match="KeyError"):
        check_tree_sampler(boom, SHAPE, DRAFT, TARGET, process="iid", n_samples=50, rng=0)

    def writes(tree, P, Q, rng):
        Q[0, 0] = 1.0
        return 0, 0

    with pytest.raises(StepError, match="read-only"):
        check_tree_sampler(writes, SHAPE, DRAFT, TARGET, process="iid", n_samples=50, rng=0)


# ---------------------------------------------------------------------------
# SGLang's arrays
# ---------------------------------------------------------------------------


def _trees():
    yield from (T for T, _ in enumerate_trees(TreeShape([(0,), (1,), (1, 0), (1, 1)]), DRAFT, process="iid")[:40])
    yield sample_tree(Eagle2Params(depth=3, top_k=2, total_tokens=7), random_table_model(4, 4, rng=0),
                      process="eagle2")
    yield DraftTree(None, [-1], [-1])


def test_sglang_arrays_round_trip():
    for T in _trees():
        cand, ridx, first, nxt = sglang_tree_arrays(T)
        np.testing.assert_array_equal(ridx, np.arange(T.n + 1))
        back, order = tree_from_sglang(cand, first, nxt)
        assert back.paths() == [T.paths()[i] for i in order]
        assert [len(back.children(v)) for v in range(back.n + 1)] == [len(T.children(o)) for o in order]
        for v in range(back.n + 1):  # siblings keep their rank order
            assert [order[c] for c in back.children(v)] == list(T.children(int(order[v])))


def test_sglang_arrays_in_another_order():
    # SGLang index 1 is a grandchild, 2 and 3 the root's children (ranks: 2 first)
    back, order = tree_from_sglang(np.array([9, 2, 5, 7]), [2, -1, 1, -1], [-1, -1, 3, -1])
    assert back.paths()[1:] == [(5,), (7,), (5, 2)] and order.tolist() == [0, 2, 3, 1]


@pytest.mark.parametrize("args,match", [
    (([0, 1, 2], [1, 2, 1], [-1, -1, -1]), "reached twice"),
    (([0, 1, 2], [1, -1, -1], [-1, -1, -1]), "not reachable"),
    (([0, 1, 2], [1, -1, 5], [-1, -1, -1]), "`retrive_next_token\\[2\\]`"),
    (([0, 1, 2], [1, -1, -1], [0, -1, -1]), "`retrive_next_sibling\\[0\\]`"),
    (([0, 1], [1, -1, -1], [-1, -1, -1]), "one length"),
    (([0, -4], [1, -1], [-1, -1]), "`candidates\\[1\\]`"),
    (([0, 1.5], [1, -1], [-1, -1]), "integers"),
])
def test_sglang_arrays_are_validated(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        tree_from_sglang(*args)


# ---------------------------------------------------------------------------
# SGLang's tree verification kernel
# ---------------------------------------------------------------------------
#
# A CPU re-implementation of TreeSpeculativeSamplingTargetOnly (SGLang,
# python/sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh; `legacy`: the earlier
# sgl-kernel/csrc/speculative/speculative_sampling.cuh), called as python/sglang/srt/speculative/eagle_info.py
# calls tree_speculative_sampling_target_only: float32 scalars where the kernel has them, the walk over
# first-child / next-sibling indices with one coin per node, the cumulative target mass of the scanned
# siblings against the coin, each rejected sibling's target probability written to `draft_probs`, and the
# final token drawn from relu(target_probs - draft_probs) with its own coin (no draft_probs at max depth).


def sglang_tree_verify_reference(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                 retrive_next_token, retrive_next_sibling, uniform_samples,
                                 uniform_samples_for_final_sampling, target_probs, draft_probs,
                                 threshold_single=1.0, threshold_acc=1.0, deterministic=True, *, legacy=False):
    """SGLang's ``tree_speculative_sampling_target_only`` on CPU tensors (one thread block per request, in turn).

    ``legacy=True``: the sgl-kernel version's ``coin <= prob_acc / threshold_acc`` (no target-mass guard) and its
    fallback to token ``d - 1`` when the residual is empty.
    """
    bs = candidates.shape[0]
    num_spec = accept_index.shape[1]
    d = target_probs.shape[-1]
    # CPU tensors: their numpy views share memory, so the writes below land in the tensors
    pred, acc_idx, acc_num, dprobs = (t.numpy() for t in (predicts, accept_index, accept_token_num, draft_probs))
    f = target_probs.numpy()
    ftype = f.dtype.type
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt_tok, nxt_sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    coins, final = uniform_samples.numpy(), uniform_samples_for_final_sampling.numpy()
    ts = ftype(threshold_single)
    ta = ftype(max(float(threshold_acc), 1e-9))  # the launcher's fmaxf(threshold_acc, 1e-9f)
    zero = ftype(0)
    for bx in range(bs):
        prob_acc, row, coin = zero, 0, coins[bx, 0]
        last = ridx[bx][0]
        acc_idx[bx, 0] = last
        accepted, cur, last_rejected = 0, 0, -1
        for _ in range(1, num_spec):
            cur = nxt_tok[bx][cur]
            while cur != -1:
                tok = cand[bx][cur]
                q = f[bx, row, tok]
                prob_acc = ftype(prob_acc + q)
                if legacy:
                    ok = coin <= prob_acc / ta or q >= ts
                else:
                    ok = q > zero and (coin < prob_acc / ta or q >= ts)
                if ok:
                    prob_acc, last_rejected, row, coin = zero, -1, cur, coins[bx, cur]
                    pred[last] = tok
                    accepted += 1
                    acc_idx[bx, accepted] = ridx[bx][cur]
                    last = ridx[bx][cur]
                    break
                if q > zero:
                    last_rejected = tok
                dprobs[bx, row, tok] = q  # the rejected sibling leaves the final residual
                cur = nxt_sib[bx][cur]
            if cur == -1:
                break
        acc_num[bx] = accepted
        q = f[bx, row]
        p = dprobs[bx, row] if accepted != num_spec - 1 else np.zeros_like(q)
        relu = np.maximum(q - p, zero)
        u = final[bx] * relu.sum(dtype=ftype)
        cdf = np.cumsum(relu, dtype=ftype)
        valid = relu > zero
        hit = np.flatnonzero(valid & (cdf > u))
        if hit.size:
            sampled = int(hit[0])
        elif valid.any():  # u rounded above the last cumulative sum: the last valid index
            sampled = int(np.flatnonzero(valid)[-1])
        else:
            sampled = d - 1 if legacy or last_rejected == -1 else last_rejected
        pred[last] = sampled


sglang_tree_verify_reference_legacy = functools.partial(sglang_tree_verify_reference, legacy=True)


class SGLangRule(TreeVerifier):
    """The kernel's exact emission law in float64: sibling ``i`` of a node is accepted when the coin falls in
    ``[S_{i-1}, S_i) / threshold_acc`` (``S_i`` the target mass of the first ``i`` siblings, duplicates counted
    again) or, first, when its target probability is at least ``threshold_single``; if none is, the token is
    drawn from the target with the siblings' tokens removed."""

    processes = ()
    name = "sglang-rule"

    def __init__(self, threshold_single=1.0, threshold_acc=1.0):
        self.ts, self.ta = threshold_single, max(threshold_acc, 1e-9)

    def emission(self, tree, p_nodes, q_nodes, *, validate=True):
        out = np.zeros(np.shape(q_nodes))
        reach = np.zeros(tree.n + 1)
        reach[0] = 1.0
        for v in range(tree.n + 1):
            q = q_nodes[v]
            kids = tree.children(v)
            lo, mass = 0.0, 0.0  # coins below `lo` accepted a sibling already
            for c in kids:
                x = int(tree.tokens[c])
                mass += q[x]
                a = 0.0 if q[x] <= 0 else (1.0 - lo if q[x] >= self.ts else max(min(1.0, mass / self.ta) - lo, 0.0))
                reach[c] = reach[v] * a
                lo += a
            rest = q.copy()
            rest[[int(tree.tokens[c]) for c in kids]] = 0.0
            if rest.sum() > 0:
                out[v] = reach[v] * max(1.0 - lo, 0.0) * rest / rest.sum()
        return out

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate=True):
        return float(tree.depth @ self.emission(tree, p_nodes, q_nodes).sum(axis=1))

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate=True):
        raise NotImplementedError("the kernel samples; this class gives its exact law")


def test_sglang_rule_is_the_target_only_rule_on_distinct_siblings():
    rule, ref = SGLangRule(), TargetOnlyVerifier()
    for shape, process in ((SHAPE, "topk"), (SHAPE, "wor")):
        for T, _ in enumerate_trees(shape, DRAFT, process=process)[:30]:
            P, Q = tree_laws(T, DRAFT, TARGET_ZEROS)
            np.testing.assert_allclose(rule.emission(T, P, Q), ref.emission(T, P, Q), rtol=0, atol=1e-15)


def test_sglang_kernel_reads_back_the_rule(torch):
    # the kernel's (node, token) on a fixed tree against the rule's exact emission law
    T = sample_tree(SHAPE, DRAFT, process="topk")
    P, Q = tree_laws(T, DRAFT, TARGET)
    step = from_sglang_kernel(sglang_tree_verify_reference, threshold_single=0.4, threshold_acc=0.6)
    gen = np.random.default_rng(11)
    counts = np.zeros(Q.shape)
    for _ in range(4000):
        counts[step(T, P, Q, gen)] += 1
    law = SGLangRule(0.4, 0.6).emission(T, P, Q)
    obs, exp = counts[law > 0], 4000 * law[law > 0]
    assert counts[law == 0].sum() == 0
    from scipy import stats

    assert stats.chi2.sf(((obs - exp) ** 2 / exp).sum(), obs.size - 1) > ALPHA


@pytest.mark.parametrize("process,target", [("topk", TARGET), ("topk", TARGET_ZEROS), ("wor", TARGET)])
def test_sglang_kernel_with_thresholds_one_passes(torch, process, target):
    # lossless on trees whose siblings are distinct tokens (EAGLE's top-k trees; draws without replacement)
    res = check_tree_sampler(from_sglang_kernel(sglang_tree_verify_reference), SHAPE, DRAFT, target, process=process,
                             tv=0.08, boundary_coins=target is TARGET_ZEROS, rng=12)
    assert res.passed, res.message


def test_sglang_kernel_on_eagle2_trees_passes(torch):
    draft, target = random_table_model(V, 4, rng=5), random_table_model(V, 4, support=2, rng=6)
    res = check_tree_sampler(from_sglang_kernel(sglang_tree_verify_reference, dtype="float64"),
                             Eagle2Params(depth=3, top_k=2, total_tokens=6), draft, target, process="eagle2",
                             tv=0.12, boundary_coins=True, rng=13)
    assert res.passed, res.message


@pytest.mark.parametrize("ts,ta", [(1.0, 0.5), (0.3, 1.0), (0.3, 0.5)])
def test_sglang_lossy_thresholds_are_flagged_naming_the_worst_cells(torch, ts, ta):
    exact_law = output_law(SHAPE, DRAFT, TARGET, process="topk", verifier=SGLangRule(ts, ta))
    exact = tv(exact_law, joint_law(TARGET, 3))
    assert exact > 0.1
    res = check_tree_sampler(from_sglang_kernel(sglang_tree_verify_reference, threshold_single=ts, threshold_acc=ta),
                             SHAPE, DRAFT, TARGET, process="topk", tv=0.75 * exact, rng=14)
    assert not res.passed and res.outside_support == 0
    assert res.tv_estimate == pytest.approx(exact, abs=res.detectable_tv)
    worst = res.worst_cells[0]
    assert str(worst.cell) in res.message and "largest standardized residuals" in res.message
    assert abs(exact_law[worst.cell] - worst.expected / res.n_samples) > 0.05  # a cell the relaxation moves


def test_sglang_legacy_coin_is_flagged_only_with_boundary_coins(torch):
    step = from_sglang_kernel(sglang_tree_verify_reference_legacy)
    kw = dict(process="topk", tv=0.1, rng=15)
    assert check_tree_sampler(step, SHAPE, DRAFT, TARGET_ZEROS, **kw).passed
    res = check_tree_sampler(step, SHAPE, DRAFT, TARGET_ZEROS, boundary_coins=True, **kw)
    assert not res.passed and res.boundary_outside > 0
    out = res.violation.output
    assert joint_law(TARGET_ZEROS, len(out))[out] == 0  # an emitted path the target never produces


def test_sglang_kernel_on_iid_trees_with_duplicate_siblings_is_lossy(torch):
    # the cumulative mass counts a repeated token twice: its twin is accepted after it was rejected
    shape = TreeShape([(0,), (1,)])
    draft = MemorylessModel([0.6, 0.3, 0.1])
    target = MemorylessModel([0.3, 0.3, 0.4])
    law = output_law(shape, draft, target, process="iid", verifier=SGLangRule())
    exact = tv(law, joint_law(target, 2))
    # by hand: two children carrying token y (probability p(y)**2) accept y with probability min(1, 2 q(y)),
    # else emit from q without y; distinct children emit the first token from q
    p, q = draft.dist, target.dist
    first = (1 - (p * p).sum()) * q
    for y in range(3):
        a = min(1.0, 2 * q[y])
        first += p[y] ** 2 * np.where(np.arange(3) == y, a, (1 - a) * q / (1 - q[y]))
    np.testing.assert_allclose(law.sum(axis=1), first, rtol=0, atol=1e-15)
    assert exact > 0.05
    assert check_lossless("target-only", shape, draft, target, process="iid").passed  # the rule itself is not lossy
    res = check_tree_sampler(from_sglang_kernel(sglang_tree_verify_reference), shape, draft, target, process="iid",
                             tv=0.75 * exact, rng=16)
    assert not res.passed and res.tv_estimate == pytest.approx(exact, abs=res.detectable_tv)


def test_from_sglang_kernel_validates_and_checks_the_kernel_outputs(torch):
    with pytest.raises(TypeError, match="`fn`"):
        from_sglang_kernel(None)
    with pytest.raises(ValueError, match="`threshold_acc`"):
        from_sglang_kernel(sglang_tree_verify_reference, threshold_acc=0.0)
    with pytest.raises(ValueError, match="`dtype`"):
        from_sglang_kernel(sglang_tree_verify_reference, dtype="bfloat16")

    def skips_a_level(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                      retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                      draft_probs, threshold_single, threshold_acc, deterministic):
        accept_token_num[0] = 1
        accept_index[0, :2] = torch.tensor([0, 3])  # node 3 is a grandchild of the root
        predicts[0], predicts[3] = int(candidates[0, 3]), 0

    with pytest.raises(StepError, match="not a root path"):
        check_tree_sampler(from_sglang_kernel(skips_a_level), SHAPE, DRAFT, TARGET, process="topk", n_samples=50,
                           rng=0)
