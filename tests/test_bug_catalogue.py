"""Negative controls: eight classes of losslessness bugs that shipped in serving engines, each flagged.

Each defect is our own numpy implementation of the mathematics of a bug class (issue numbers for reference
only); each comes with its corrected twin, which must pass, so that a flag is the defect's and not the
harness's. Every correct verifier of the package passes the same harness; the lossy ones are flagged.

False-failure budget of this file: every check of a correct sampler runs at alpha_fail = 1e-4 with a
fixed seed; there are 40 of them, so over seeds the file fails spuriously with probability <= 4e-3 (union
bound). A defect is detected with probability >= 0.99 at its stated TV (each check asks for a TV below
the defect's exact TV, so the power is higher still); the seeds are fixed, so the outcome is deterministic.
"""

import numpy as np
import pytest

import otspec
from otspec._verifier import sample_from
from otspec.models import joint_law, random_table_model
from otspec.multidraft import VERIFIERS
from otspec.testing import check_block_sampler, check_sampler, check_tree_sampler, processed_law
from otspec.tree import SequoiaVerifier, SpecInferVerifier, TreeShape, TreeVerifier, output_law, sample_tree, tree_laws
from otspec.tree import check_lossless as check_tree_lossless

ALPHA = 1e-4


def softmax(logits):
    z = np.exp(logits - np.max(logits))
    return z / z.sum()


def tv(a, b):
    return 0.5 * float(np.abs(np.asarray(a) - np.asarray(b)).sum())


def draw(law_rows, u):
    """Inverse-CDF draw per row: ``law_rows`` (B, V) or (V,), ``u`` (B,) uniforms; zero-mass entries never drawn."""
    w = np.broadcast_to(law_rows, (u.shape[0], np.shape(law_rows)[-1]))
    c = np.cumsum(w, axis=1)
    idx = (c <= (u * c[:, -1])[:, None]).sum(axis=1)
    return np.minimum(idx, w.shape[1] - 1 - np.argmax(w[:, ::-1] > 0, axis=1))


def speculative(p_verify, q_verify, *, coin=None, residual=None, strict=True):
    """Speculative sampling for one draft, batched (Leviathan et al., arXiv:2211.17192, Algorithm 1; p draft,
    q target). ``coin`` replaces the uniform coin, ``residual`` the law drawn after a rejection."""
    res = np.maximum(q_verify - p_verify, 0.0) if residual is None else residual
    res = res / res.sum() if res.sum() > 0 else q_verify  # p == q: no rejection ever happens

    def step(drafts, rng):
        x = drafts[:, 0]
        u = rng.random(x.shape[0]) if coin is None else np.full(x.shape[0], coin)
        accept = u * p_verify[x] < q_verify[x] if strict else u * p_verify[x] <= q_verify[x]
        return np.where(accept, x, draw(res, rng.random(x.shape[0])))

    return step


def flagged(res):
    return not res.passed


# ---------------------------------------------------------------------------
# 1-5, 7: one draft, token level
# ---------------------------------------------------------------------------

DRAFT_LOGITS = np.array([2.0, 1.5, 0.3, -0.5, -1.0])
TARGET_LOGITS = np.array([1.2, 1.8, 0.9, -0.2, 0.5])


def test_1_greedy_drafts_verified_with_the_softmax_law():
    # transformers #32867: drafts are argmax (law: a point mass) but the ratio and residual use the softmax
    p_soft, q = softmax(DRAFT_LOGITS), softmax(TARGET_LOGITS)
    greedy = np.eye(5)[np.argmax(DRAFT_LOGITS)]
    assert flagged(check_sampler(speculative(p_soft, q), greedy, q, batched=True, tv=0.05, rng=1))
    assert check_sampler(speculative(greedy, q), greedy, q, batched=True, rng=1).passed  # corrected


def test_2_sampling_parameters_applied_to_one_side_only():
    # transformers #47932, vLLM #9834: drafts from processed logits (T = 0.7, top-k = 3), target law from raw logits
    p = processed_law(DRAFT_LOGITS, temperature=0.7, top_k=3)
    q = processed_law(TARGET_LOGITS, temperature=0.7, top_k=3)
    raw = softmax(TARGET_LOGITS)
    res = check_sampler(speculative(p, raw), p, q, batched=True, tv=tv(raw, q) / 2, rng=2)
    assert flagged(res) and res.outside_support > 0  # tokens the top-k removed come out
    assert check_sampler(speculative(p, q), p, q, batched=True, rng=2).passed


def test_3_fixed_zero_coin_accepts_every_draft():
    # vllm-ascend #13730: u = 0 always; the output law is the draft law
    p, q = softmax(DRAFT_LOGITS), softmax(TARGET_LOGITS)
    assert flagged(check_sampler(speculative(p, q, coin=0.0), p, q, batched=True, tv=tv(p, q) / 2, rng=3))


def test_4_non_strict_coin_accepts_a_zero_probability_draft_only_with_boundary_coins():
    # SGLang #35771: `u <= ratio` with u in [0, 1) accepts x with q(x) = 0 when u == 0.0 exactly
    p = softmax(DRAFT_LOGITS)
    q = processed_law(TARGET_LOGITS, top_k=3)  # zeros where p is positive
    loose = speculative(p, q, strict=False)
    assert check_sampler(loose, p, q, batched=True, rng=4).passed  # invisible to frequencies
    res = check_sampler(loose, p, q, batched=True, boundary_coins=True, rng=4)
    assert flagged(res) and res.boundary_outside > 0 and q[res.violation.output] == 0
    assert check_sampler(speculative(p, q), p, q, batched=True, boundary_coins=True, rng=4).passed


def test_5_residual_from_q_instead_of_the_positive_part():
    # resampling from q after a rejection (instead of (q - p)+)
    p, q = softmax(DRAFT_LOGITS), softmax(TARGET_LOGITS)
    assert flagged(check_sampler(speculative(p, q, residual=q), p, q, batched=True, tv=0.02, rng=5))


def test_5_uninitialised_residual_buffer():
    # SGLang #12512: the residual buffer is allocated but never written; drawing from it picks garbage
    p, q = softmax(DRAFT_LOGITS), softmax(TARGET_LOGITS)
    buffer = np.zeros(5)
    buffer[-1] = 1e-300  # what an unwritten buffer happened to hold

    assert flagged(check_sampler(speculative(p, q, residual=buffer), p, q, batched=True, tv=0.02, rng=5))


def bf16(x):
    """Round float32 to bfloat16 (nearest, ties to even), kept in float32."""
    b = np.asarray(x, np.float32).view(np.uint32)
    b = (b + np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return b.astype(np.uint32).view(np.float32)  # numpy 1.26 widens a 0-d uint32 sum to int64 (value-based casting)


def test_7_bf16_draft_softmax_verified_against_float32_laws():
    # DeepSpec #31: drafts drawn from a bf16 softmax, ratio and residual from the float32 law. These logits
    # (the largest shift among 20,000 random draws of 4 normal(0, 1.5) logits) move the law by TV 2.2e-3.
    logits = np.array([-0.28700763, 2.426218, 1.7978355, -1.0544552], dtype=np.float32)
    e = np.exp((logits - logits.max()).astype(np.float32))
    p32 = (e / e.sum()).astype(np.float64)
    p32 /= p32.sum()
    eb = bf16(np.exp(bf16(logits - logits.max())))
    p_bf = bf16(eb / bf16(eb.sum())).astype(np.float64)
    p_bf /= p_bf.sum()  # the multinomial normalises
    q = p32  # draft and target agree in float32 on this context: the correct output is q itself
    shift = tv(p_bf, q)
    assert 2e-3 < shift < 2.5e-3
    res = check_sampler(speculative(p32, q), p_bf, q, batched=True, tv=shift * 0.75, rng=7)
    assert flagged(res), res.message
    assert check_sampler(speculative(p_bf, q), p_bf, q, batched=True, n_samples=res.n_samples // 8, rng=7).passed


# ---------------------------------------------------------------------------
# 8: multi-draft recursive rejection
# ---------------------------------------------------------------------------


def recursive_rejection(p, q, k, *, update=True):
    """Recursive rejection sampling over k i.i.d. drafts (SpecInfer, Miao et al., arXiv:2305.09781,
    Algorithm 2): after each rejection the target becomes the normalised residual (q_i - p)+."""

    def step(drafts, rng):
        B = drafts.shape[0]
        target = np.broadcast_to(q, (B, q.shape[0])).copy()
        out = np.full(B, -1)
        for i in range(k):
            live = out < 0
            x = drafts[:, i]
            acc = live & (rng.random(B) * p[x] < target[np.arange(B), x])
            out[acc] = x[acc]
            rej = live & ~acc
            if update:
                r = np.maximum(target[rej] - p, 0.0)
                s = r.sum(axis=1, keepdims=True)
                target[rej] = np.where(s > 0, r / np.where(s > 0, s, 1.0), target[rej])
        live = out < 0
        last = np.maximum(target[live] - p, 0.0) if not update else target[live]
        out[live] = draw(last, rng.random(int(live.sum())))
        return out

    return step


def test_8_recursive_rejection_that_forgets_to_update_the_target():
    p, q = softmax(DRAFT_LOGITS), softmax(TARGET_LOGITS)
    assert flagged(check_sampler(recursive_rejection(p, q, 2, update=False), p, q, k=2, batched=True, tv=0.02,
                                 rng=8))
    assert check_sampler(recursive_rejection(p, q, 2), p, q, k=2, batched=True, rng=8).passed


# ---------------------------------------------------------------------------
# 6: block level
# ---------------------------------------------------------------------------

V, L = 3, 2
DRAFT = random_table_model(V, L + 1, rng=11)
TARGET = random_table_model(V, L + 1, rng=12)


def _cond(model, prefix):
    return np.asarray(model.next_dist(tuple(prefix)), dtype=np.float64)


def token_wise(*, off_by_one=False, bonus_model=TARGET):
    """Per-token speculative sampling along the block (Leviathan et al., Algorithm 1)."""

    def step(block, rng):
        for i, x in enumerate(block):
            pi = _cond(DRAFT, block[:i])
            qi = _cond(TARGET, block[: i + 1] if off_by_one else block[:i])  # off-by-one: one position late
            if not rng.random() * pi[x] < qi[x]:
                r = np.maximum(qi - pi, 0.0)
                return tuple(block[:i]) + (int(draw(r, np.array([rng.random()]))[0]),)
        return tuple(block) + (int(draw(_cond(bonus_model, block), np.array([rng.random()]))[0]),)

    return step


def block_verification(*, joint_residual=True):
    """Block verification (Sun et al., arXiv:2403.10444 v1, Algorithm 3): accept the block with
    min(1, M_q(X^L)/M_p(X^L)), then walk back accepting X^k with min(1, p_remain/p_rej); the tokens after
    the accepted prefix come from the joint residual (M_q(y^j, .) - M_p(y^j, .))+ (eq. 10)."""

    def joint(model, seq):
        return float(np.prod([_cond(model, seq[:j])[seq[j]] for j in range(len(seq))]))

    def step(block, rng):
        block = tuple(block)
        if rng.random() * joint(DRAFT, block) < joint(TARGET, block):
            return block + (int(draw(_cond(TARGET, block), np.array([rng.random()]))[0]),)
        tau = 0
        for k in range(L - 1, 0, -1):
            pre = block[:k]
            d = joint(TARGET, pre) * _cond(TARGET, pre) - joint(DRAFT, pre) * _cond(DRAFT, pre)
            remain, rej = np.maximum(d, 0).sum(), np.maximum(-d, 0).sum()
            if rng.random() * rej < remain:
                tau = k
                break
        out = block[:tau]
        for _ in range(tau, L):
            if joint_residual:
                w = joint(TARGET, out) * _cond(TARGET, out) - joint(DRAFT, out) * _cond(DRAFT, out)
            else:  # the defect: the token-wise residual of speculative sampling
                w = _cond(TARGET, out) - _cond(DRAFT, out)
            w = np.maximum(w, 0.0)
            law = w if w.sum() > 0 else _cond(TARGET, out)
            out += (int(draw(law, np.array([rng.random()]))[0]),)
        return out

    return step


def test_6_our_block_implementations_are_correct_when_written_right():
    for step in (token_wise(), block_verification()):
        res = check_block_sampler(step, DRAFT, TARGET, L, tv=0.05, rng=60)
        assert res.passed, res.message


@pytest.mark.parametrize("defect,step", [
    ("block verification with the token-wise residual (vllm-ascend #7807)", block_verification(joint_residual=False)),
    ("target conditional read one position late (off by one)", token_wise(off_by_one=True)),
    ("bonus token from the draft model", token_wise(bonus_model=DRAFT)),
])
def test_6_block_defects_are_flagged(defect, step):
    res = check_block_sampler(step, DRAFT, TARGET, L, tv=0.05, rng=61)
    assert flagged(res), f"{defect}: {res.message}"


# ---------------------------------------------------------------------------
# every verifier of the package
# ---------------------------------------------------------------------------

PAIRS = {
    "generic": (softmax(DRAFT_LOGITS), softmax(TARGET_LOGITS)),
    "zeros": (np.array([0.3, 0.3, 0.2, 0.2, 0.0]), np.array([0.5, 0.0, 0.2, 0.0, 0.3])),
}
TOKEN = [n for n, s in VERIFIERS.items() if s.kind == "token" and s.lossless]
LOSSY = [n for n, s in VERIFIERS.items() if s.kind == "token" and not s.lossless]
BLOCK = [n for n, s in VERIFIERS.items() if s.build_block is not None]


def package_step(v, draft_process):
    """The verifier's sampler on the harness's drafts; for a deterministic draft process (greedy,
    top-k), on the verifier's own drafts (the harness's are ignored: end to end)."""
    if draft_process in ("iid", "without_replacement"):
        return lambda drafts, rng: v.sample(drafts, rng=rng)
    return lambda drafts, rng: v.sample(v.sample_drafts(rng=rng), rng=rng)


def ks(name):
    return (1,) if VERIFIERS[name].single_draft else (1, 2)


def run_package(name, p, q, k, **kw):
    spec = VERIFIERS[name]
    v = spec.build(p, q, k, **OPTIONS.get(name, {}))
    return v, check_sampler(package_step(v, spec.draft_process), p, q, k=k,
                            replacement=spec.draft_process != "without_replacement", alpha_fail=ALPHA, **kw)


#: options for the verifiers that require some (a new lossy verifier with required options must be added here)
OPTIONS = {"mentored": {"D": 0.05}, "ensemble": {"w": 0.5}}


@pytest.mark.parametrize("name,k,pair", [(n, k, pr) for n in TOKEN for k in ks(n) for pr in PAIRS])
def test_every_lossless_token_verifier_passes(name, k, pair):
    p, q = PAIRS[pair]
    _, res = run_package(name, p, q, k, tv=0.05, rng=100 + k)
    assert res.passed, f"{name}, k={k}, {pair}: {res.message}"


@pytest.mark.parametrize("name", TOKEN)
def test_every_lossless_token_verifier_with_boundary_coins(name):
    # every coin of the package is strict, `u * p < q` (issue 15)
    p, q = PAIRS["zeros"]
    _, res = run_package(name, p, q, 1, tv=0.05, boundary_coins=True, rng=7)
    assert res.passed, f"{name}: {res.message}"


@pytest.mark.parametrize("name", LOSSY)
def test_every_lossy_token_verifier_is_flagged_with_its_tv(name):
    assert set(VERIFIERS[name].required) <= set(OPTIONS.get(name, {})), f"give {name!r} its options in OPTIONS"
    p, q = PAIRS["generic"]
    v = VERIFIERS[name].build(p, q, 1, **OPTIONS.get(name, {}))
    exact = tv(v.output_law(), q)
    assert exact > 0.01, f"{name}: exact TV {exact:.3g} is too small to flag here"
    _, res = run_package(name, p, q, 1, tv=exact * 0.75, rng=9)
    assert flagged(res)
    assert res.tv_estimate == pytest.approx(exact, abs=res.detectable_tv)


@pytest.mark.parametrize("name", BLOCK)
def test_every_block_verifier_passes(name):
    v = VERIFIERS[name].build_block(DRAFT, TARGET, L)
    res = check_block_sampler(lambda b, rng: v.verify(b, rng=rng).output, DRAFT, TARGET, L, tv=0.05,
                              boundary_coins=True, rng=12)
    assert res.passed, f"{name}: {res.message}"


def test_lenient_verifier_is_flagged():
    p, q = PAIRS["generic"]
    v = otspec.lenient_verifier(p, q, 0.5)
    exact = tv(v.output_law(), q)
    res = check_sampler(package_step(v, "iid"), p, q, tv=exact * 0.75, rng=10)
    assert flagged(res) and exact > 0.01


# ---------------------------------------------------------------------------
# 9: draft trees
# ---------------------------------------------------------------------------
#
# A reference tree sampler written on the node laws -- multi-step speculative sampling (Miao et al., SpecInfer,
# arXiv:2305.09781, §4) with replacement, or without (Chen et al., Sequoia, arXiv:2402.12374, §3.2) -- with one
# switch per planted defect. Its exact emission law (same per-node code, no coins) gives each defect's exact TV
# through otspec.tree.output_law, and the correct reference is checked exactly lossless and equal to the
# package's SpecInfer / Sequoia emissions. This section adds 3 checks of correct samplers at alpha_fail = 1e-4.


def _ratio(num, den):
    if den > 0:
        return min(1.0, num / den)
    return 1.0 if num > 0 else 0.0


class MultiStepTree(TreeVerifier):
    """Multi-step speculative sampling on a draft tree; ``defect`` plants one bug.

    ``"unnormalised"``: the residual after a rejection is not renormalised at nodes below the root;
    ``"bonus-parent"``: the bonus token at a leaf is drawn from the parent's target law;
    ``"memo"``: a sibling repeating an earlier sibling's token reuses that sibling's acceptance test (its
    ratio against the law before the rejection), so a duplicate is accepted after its twin was rejected;
    ``"leaf-residual"``: a leaf emits from the residual (q - p)+ of its own laws instead of the bonus law q;
    ``"non-strict"``: the coin test is ``u * p <= q``, which accepts a child of target probability 0 on u = 0.
    """

    DEFECTS = ("unnormalised", "bonus-parent", "memo", "leaf-residual", "non-strict")

    def __init__(self, *, replacement=True, defect=None):
        assert defect is None or defect in self.DEFECTS
        self.replacement, self.defect = replacement, defect
        self.processes = ("iid",) if replacement else ("wor",)
        self.name = "multistep-" + ("iid" if replacement else "wor") + (f"-{defect}" if defect else "")

    def _node(self, tree, P, Q, v, kids):
        """Per child, the operands ``(num, den)`` of its coin test ``u * den < num``; the law drawn if all fail."""
        if not kids:
            if v and self.defect == "bonus-parent":
                return [], Q[tree.parents[v]]
            if self.defect == "leaf-residual":
                r = np.maximum(Q[v] - P[v], 0.0)
                return [], r if r.sum() > 0 else Q[v]
            return [], Q[v]
        q, p = Q[v].copy(), P[v].copy()
        normalise = self.defect != "unnormalised" or v == 0
        tests, seen = [], {}
        for c in kids:
            x = int(tree.tokens[c])
            test = seen[x] if self.defect == "memo" and x in seen else (q[x], p[x])
            seen.setdefault(x, test)
            tests.append(test)
            r = np.maximum(q - p, 0.0)  # rejected: the residual (a rejection of probability 0 keeps q)
            if r.sum() > 0:
                q = r / r.sum() if normalise else r
            if not self.replacement:  # the next draw is from p without the rejected token
                p[x] = 0.0
                p /= p.sum() if p.sum() > 0 else 1.0
        return tests, q

    def emission(self, tree, p_nodes, q_nodes, *, validate=True):
        out = np.zeros(np.shape(q_nodes))
        reach = np.zeros(tree.n + 1)
        reach[0] = 1.0
        for v in range(tree.n + 1):  # parents before children
            kids = tree.children(v)
            tests, final = self._node(tree, p_nodes, q_nodes, v, kids)
            w = reach[v]
            for c, (num, den) in zip(kids, tests):
                a = _ratio(num, den)
                reach[c] = w * a
                w *= 1.0 - a
            out[v] = w * final / final.sum()
        return out

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate=True):
        return float(tree.depth @ self.emission(tree, p_nodes, q_nodes).sum(axis=1))

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate=True):
        v = 0
        while True:
            kids = tree.children(v)
            tests, final = self._node(tree, p_nodes, q_nodes, v, kids)
            for c, (num, den) in zip(kids, tests):
                u = rng.random()
                if (u * den <= num) if self.defect == "non-strict" else (u * den < num):
                    v = c
                    break
            else:
                return v, sample_from(final, rng)


TREE = TreeShape([(0,), (1,), (0, 0), (0, 1)])  # the root's children, one of them with two children, a leaf at depth 1
TREE_DRAFT = random_table_model(3, 3, rng=29)
TREE_TARGET = random_table_model(3, 3, rng=129)
TREE_TARGET_ZEROS = random_table_model(3, 3, support=2, rng=7)  # each conditional on 2 of the 3 tokens


def tree_tv(v, process="iid", target=TREE_TARGET):
    """Exact TV between the completed output law of ``v`` and the target's (enumeration of the realised trees)."""
    return tv(output_law(TREE, TREE_DRAFT, target, process=process, verifier=v), joint_law(target, 3))


@pytest.mark.parametrize("replacement,process,package", [(True, "iid", SpecInferVerifier()),
                                                         (False, "wor", SequoiaVerifier())])
def test_9_reference_tree_samplers_are_exactly_lossless_and_pass(replacement, process, package):
    ref = MultiStepTree(replacement=replacement)
    assert check_tree_lossless(ref, TREE, TREE_DRAFT, TREE_TARGET, process=process).max_error < 1e-12
    for seed in range(3):  # the same emission law as the package's verifier, on realised trees
        T = sample_tree(TREE, TREE_DRAFT, process=process, rng=seed)
        P, Q = tree_laws(T, TREE_DRAFT, TREE_TARGET)
        np.testing.assert_allclose(ref.emission(T, P, Q), package.emission(T, P, Q), rtol=0, atol=1e-15)
    res = check_tree_sampler(ref, TREE, TREE_DRAFT, TREE_TARGET, process=process, tv=0.06, rng=90)
    assert res.passed, res.message


@pytest.mark.parametrize("defect,exact", [
    ("unnormalised", 0.0892), ("bonus-parent", 0.2638), ("memo", 0.1661), ("leaf-residual", 0.1705),
])
def test_9_tree_defects_are_flagged_with_their_tv(defect, exact):
    v = MultiStepTree(defect=defect)
    assert tree_tv(v) == pytest.approx(exact, abs=1e-4)
    res = check_tree_sampler(v, TREE, TREE_DRAFT, TREE_TARGET, process="iid", tv=0.75 * exact, rng=91)
    assert flagged(res), res.message
    assert res.tv_estimate == pytest.approx(exact, abs=res.detectable_tv)
    assert str(res.worst_cells[0].cell) in res.message


def test_9_non_strict_coin_at_a_tree_node_is_flagged_only_with_boundary_coins():
    loose = MultiStepTree(defect="non-strict")
    assert tree_tv(loose, target=TREE_TARGET_ZEROS) < 1e-15  # the same law: a coin of exactly 0 has probability 0
    kw = dict(process="iid", tv=0.08, rng=92)
    assert check_tree_sampler(loose, TREE, TREE_DRAFT, TREE_TARGET_ZEROS, **kw).passed  # invisible to frequencies
    res = check_tree_sampler(loose, TREE, TREE_DRAFT, TREE_TARGET_ZEROS, boundary_coins=True, **kw)
    assert flagged(res) and res.boundary_outside > 0 and res.violation.phase == "boundary"
    assert joint_law(TREE_TARGET_ZEROS, len(res.violation.output))[res.violation.output] == 0
    res = check_tree_sampler(MultiStepTree(), TREE, TREE_DRAFT, TREE_TARGET_ZEROS, boundary_coins=True, **kw)
    assert res.passed, res.message
