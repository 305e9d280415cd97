"""Hugging Face transformers as a client of otspec.testing: `_speculative_sampling` and `generate(assistant_model=...)`.

transformers' `_speculative_sampling` (generation/utils.py) swaps the letters: its `q` is the assistant
(draft) law and its `p` the target law; here p is the draft and q the target, as everywhere in otspec.
It draws its coins with `torch.rand_like` and its residual with `torch.multinomial`, both from torch's
global generator: the wrappers below replace `torch.rand_like` by the harness's `rng` (so boundary coins
reach the acceptance test; a float32 coin keeps the top of [0, 1) below 1) and seed torch's generator
from the test's seed inside `torch.random.fork_rng()`.

False-failure budget: the checks of lossless settings run at alpha_fail = 1e-4 each (fixed seeds; at
most 30 of them, so <= 3e-3 over seeds by the union bound).
"""

import contextlib
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings

from otspec.models import MemorylessModel, random_table_model
from otspec.testing import check_block_sampler, check_sampler, chi2_gof, processed_law, sample_size, seed_for
from otspec.testing.strategies import SamplingLaw, sampling_laws

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.utils import _speculative_sampling  # noqa: E402

F32_TOP = np.nextafter(np.float32(1.0), np.float32(0.0))


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny tensors: torch's thread pool only adds contention on a shared machine (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@contextlib.contextmanager
def hf_randomness(rng_holder, seed):
    """torch's global generator seeded from ``seed`` (restored afterwards); ``torch.rand_like`` draws the
    harness's coins from ``rng_holder[0]``, the rng of the current ``step`` call."""
    def rand_like(t, **kwargs):
        u = np.asarray(rng_holder[0].random(tuple(t.shape)), dtype=np.float64)
        u32 = np.minimum(u.astype(np.float32), F32_TOP)  # float32 rounding must not reach 1.0
        return torch.from_numpy(u32).to(dtype=t.dtype)

    with torch.random.fork_rng(), mock.patch.object(torch, "rand_like", rand_like):
        torch.manual_seed(seed)
        yield


def log32(law):
    with np.errstate(divide="ignore"):
        return torch.tensor(np.log(np.asarray(law)), dtype=torch.float32)


def hf_token_step(p_logits, q_logits, holder, *, weight=None):
    """One draft, one position: candidate logits (1, 1, V), target logits (1, 2, V) (the second row is the
    bonus position, unused at token level)."""
    cand = p_logits.reshape(1, 1, -1)
    new = torch.stack([q_logits, q_logits]).reshape(1, 2, -1)

    def step(drafts, rng):
        holder[0] = rng
        toks, _ = _speculative_sampling(torch.tensor([[0, drafts[0]]]), cand, 1, new,
                                        assistant_ensemble_weight=weight)
        return int(toks[0, 0])

    return step


def hf_check(p, q, *, weight=None, seed=0, law=None, **kw):
    """check_sampler on transformers' token step for (p, q), against ``law`` (default: q)."""
    holder = [None]
    with hf_randomness(holder, seed):
        step = hf_token_step(log32(p), log32(q), holder, weight=weight)
        return check_sampler(step, p, q if law is None else law, rng=seed, **kw)


P = np.array([0.35, 0.25, 0.2, 0.15, 0.05])
Q = np.array([0.1, 0.3, 0.3, 0.1, 0.2])
Q_ZERO = np.array([0.4, 0.0, 0.3, 0.3, 0.0])  # zeros where the draft is positive (a top-k'd target)


# ---------------------------------------------------------------------------
# token level
# ---------------------------------------------------------------------------


def test_token_level_is_lossless_in_frequency():
    res = hf_check(P, Q_ZERO, tv=0.1, seed=2)
    assert res.passed, res.message


@pytest.mark.slow
def test_token_level_is_lossless_in_frequency_at_tv_003():
    for seed, q in enumerate((Q, Q_ZERO)):
        res = hf_check(P, q, tv=0.03, seed=seed)
        assert res.passed, res.message


def test_token_level_non_strict_coin_is_a_finding():
    # FINDING: `is_accepted = r_i <= probability_ratio` accepts a draft the target gives probability 0 when
    # the float32 coin is exactly 0.0 (probability 2**-24 per coin): the bug class of SGLang #35771.
    res = hf_check(P, Q_ZERO, n_samples=2000, boundary_coins=True, seed=3)
    assert not res.passed and res.boundary_outside > 0
    assert Q_ZERO[res.violation.output] == 0 and res.violation.drafts == (res.violation.output,)


def test_assistant_ensemble_weight_is_flagged_with_its_tv():
    # DIVERSE static ensemble (arXiv:2604.07622): accept with min(1, 1 - w + w q/p), residual (q - p)+
    w = 0.5
    a = np.minimum(1.0, 1.0 - w + w * Q / P)
    res_law = np.maximum(Q - P, 0.0) / np.maximum(Q - P, 0.0).sum()
    law = P * a + (1.0 - float(np.sum(P * a))) * res_law
    exact_tv = 0.5 * float(np.abs(law - Q).sum())
    assert exact_tv > 0.05
    res = hf_check(P, Q, weight=w, tv=exact_tv * 0.75, seed=4)
    assert not res.passed
    assert res.tv_estimate == pytest.approx(exact_tv, abs=res.detectable_tv / 2)
    # the same check confirms the exact law of the lossy rule (it *is* that rule, just not lossless)
    assert hf_check(P, Q, law=law, weight=w, tv=0.1, seed=4).passed


# ---------------------------------------------------------------------------
# logits level: raw logits, transformers' own warpers, against the independently processed laws
# ---------------------------------------------------------------------------


def hf_warp(logits, s):
    procs = [TemperatureLogitsWarper(s.temperature)]
    if s.top_k is not None:
        procs.append(TopKLogitsWarper(s.top_k))
    if s.top_p is not None:
        procs.append(TopPLogitsWarper(s.top_p))
    x = torch.tensor(np.asarray(logits), dtype=torch.float32).reshape(1, -1)
    return LogitsProcessorList(procs)(torch.zeros((1, 1), dtype=torch.long), x).reshape(-1)


def logits_level_check(draft_logits, target_logits, s, *, tv):
    """Raw logits through transformers' warpers (sampling parameters ``s`` for both models, as generate()
    applies them) into `_speculative_sampling`, checked against our independently processed laws."""
    p = processed_law(draft_logits, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    q = processed_law(target_logits, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
    holder = [None]
    seed = seed_for(p, q)
    with hf_randomness(holder, seed % 2**32):
        step = hf_token_step(hf_warp(draft_logits, s), hf_warp(target_logits, s), holder)
        return check_sampler(step, p, q, tv=tv, alpha_fail=1e-4, rng=seed)


def test_logits_level_at_temperature_07_top_k_3_top_p_09():
    s = SamplingLaw(np.zeros(6), 0.7, 3, 0.9, np.zeros(6))
    res = logits_level_check(np.array([2.0, 1.5, 0.3, -0.5, -1.0, 0.8]), np.array([1.2, 1.8, 0.9, -0.2, 0.5, 1.0]),
                             s, tv=0.1)
    assert res.passed, res.message


EXAMPLES = 8


@pytest.mark.slow
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None)
@given(d=sampling_laws(min_n=3, max_n=6, separated=True), t=sampling_laws(min_n=3, max_n=6, separated=True))
def test_logits_level_with_temperature_top_k_top_p(d, t):
    n = min(d.logits.size, t.logits.size)
    if t.top_k is not None and t.top_k > n:
        return
    res = logits_level_check(d.logits[:n], t.logits[:n], t, tv=0.05)
    assert res.passed, (res.message, t)


# ---------------------------------------------------------------------------
# block level (L = 2)
# ---------------------------------------------------------------------------


def hf_block_step(draft, target, L, holder):
    def cond(model, prefix):
        return log32(model.next_dist(tuple(prefix)))

    def step(block, rng):
        holder[0] = rng
        cand = torch.stack([cond(draft, block[:i]) for i in range(L)]).unsqueeze(0)
        new = torch.stack([cond(target, block[:i]) for i in range(L + 1)]).unsqueeze(0)
        toks, _ = _speculative_sampling(torch.tensor([[0, *block]]), cand, L, new)
        return toks[0].tolist()

    return step


def hf_block_check(draft, target, *, seed, **kw):
    holder = [None]
    with hf_randomness(holder, seed):
        return check_block_sampler(hf_block_step(draft, target, 2, holder), draft, target, 2, rng=seed, **kw)


def test_block_level_is_lossless_in_frequency():
    draft, target = random_table_model(3, 3, rng=21), random_table_model(3, 3, rng=22)
    res = hf_block_check(draft, target, tv=0.1, seed=5)
    assert res.passed, res.message


def test_block_level_non_strict_coin_is_a_finding():
    draft, target = MemorylessModel([0.3, 0.4, 0.3]), MemorylessModel([0.5, 0.0, 0.5])
    assert hf_block_check(draft, target, tv=0.1, seed=6).passed
    res = hf_block_check(draft, target, n_samples=1000, boundary_coins=True, seed=6)
    assert not res.passed and 1 in res.violation.output


# ---------------------------------------------------------------------------
# generate(assistant_model=..., do_sample=True) end to end, two tiny random causal LMs (no download)
# ---------------------------------------------------------------------------

V_LM = 5
PROMPT = [[1, 2]]


def tiny_lm(seed, scale=6.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V_LM, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # spread the random logits so that temperature, top-k and top-p all matter
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def lms():
    """(draft, target): the draft is the target with noise on its output head (TV about 0.3-0.6 between
    their two-token laws), so drafts are accepted, rejected, and accepted two at a time."""
    import copy

    target = tiny_lm(2)
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.05 * torch.randn(draft.lm_head.weight.shape, generator=g))
    return draft, target


def exact_law(model, n, sampling):
    """Joint law of the first n generated tokens under the processed target law."""
    law = np.ones(1)
    with torch.no_grad():
        for j in range(n):
            prefixes = np.indices((V_LM,) * j).reshape(j, -1).T if j else np.zeros((1, 0), dtype=np.int64)
            ids = torch.tensor(np.hstack([np.tile(PROMPT, (prefixes.shape[0], 1)), prefixes]), dtype=torch.long)
            logits = model(ids).logits[:, -1, :].double().numpy()
            rows = np.array([processed_law(r, **sampling) for r in logits])
            law = (law[:, None] * rows).reshape(-1)
    return law


def generate_counts(target, draft, n, N, sampling, seed):
    """Counts of the first n tokens of N generate() calls of n + 1 new tokens (so that the assistant
    drafts n tokens in its first round: blocks of L = n are verified)."""
    counts = np.zeros(V_LM**n, dtype=np.int64)
    ids = torch.tensor(PROMPT)
    kw = dict(do_sample=True, max_new_tokens=n + 1, pad_token_id=0, **sampling)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for _ in range(N):
            out = target.generate(ids, assistant_model=draft, **kw)[0, len(PROMPT[0]):][:n].tolist()
            counts[np.ravel_multi_index(out, (V_LM,) * n)] += 1
    return counts


SETTINGS = {
    "T=1": dict(temperature=1.0, top_k=None),
    "T=0.7, top-k=3": dict(temperature=0.7, top_k=3),
    "top-p=0.8": dict(temperature=1.0, top_k=None, top_p=0.8),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_generate_with_an_assistant_follows_the_target_law(lms, name):
    draft, target = lms
    sampling = SETTINGS[name]
    n = 2
    law = exact_law(target, n, sampling)
    N = sample_size(0.1, law)
    counts = generate_counts(target, draft, n, N, sampling, seed=7)
    res = chi2_gof(counts, law, alpha_fail=1e-4)
    assert res.passed, (name, res)


def test_generate_non_strict_coin_minimal_reproducer(lms):
    # FINDING, minimal: top-k = 1 on both models with different argmax; a coin of exactly 0.0 (what
    # torch.rand returns with probability 2**-24) makes generate() emit the assistant's argmax, a token
    # the target's top-1 law gives probability 0.
    target, draft = lms[1], tiny_lm(1)  # an unrelated assistant: a different argmax
    ids = torch.tensor(PROMPT)
    t_top = int(exact_law(target, 1, dict(top_k=1)).argmax())
    d_top = int(exact_law(draft, 1, dict(top_k=1)).argmax())
    assert t_top != d_top
    zeros = lambda t, **kw: torch.zeros_like(t)  # noqa: E731
    with torch.no_grad(), mock.patch.object(torch, "rand_like", zeros):
        out = target.generate(ids, assistant_model=draft, do_sample=True, top_k=1, max_new_tokens=2,
                              pad_token_id=0)
    assert int(out[0, len(PROMPT[0])]) == d_top  # the target's top-1 law puts probability 1 on t_top


# ---------------------------------------------------------------------------
# greedy: generate(assistant_model=..., do_sample=False) against otspec's greedy speculative decoding
# ---------------------------------------------------------------------------


def test_greedy_assisted_generation_equals_otspec_greedy_speculative_decoding():
    """temperature=0 in otspec (one-hot argmax laws, smallest id on ties) against transformers' own assisted
    greedy decoding and plain greedy decoding, token for token."""
    import otspec.decoding as D

    # a target whose greedy path is not one repeated token, and an assistant whose argmax agrees with it at some
    # positions only (found by a scan of seeds; most tiny random LMs repeat one token greedily)
    target, draft = tiny_lm(7), tiny_lm(100)
    n = 24
    ids = torch.tensor(PROMPT)
    kw = dict(do_sample=False, max_new_tokens=n, pad_token_id=0)
    with torch.no_grad():
        plain = target.generate(ids, **kw)[0, len(PROMPT[0]):].tolist()
        assisted = target.generate(ids, assistant_model=draft, **kw)[0, len(PROMPT[0]):].tolist()
    assert assisted == plain  # transformers' own claim, for reference
    t, d = D.HFCausalLM(target), D.HFCausalLM(draft)
    assert D.autoregressive_decode(t, PROMPT[0], max_new_tokens=n, temperature=0).tokens.tolist() == plain
    accepted = rejected = 0
    for name, k in [("token", 1), ("kseq", 2), ("block", 1)]:  # every family on toy models: test_decoding.py
        res = D.speculative_decode(PROMPT[0], draft=d, target=t, verifier=name, k=k, L=3, max_new_tokens=n,
                                   temperature=0, rng=0)
        assert res.tokens.tolist() == plain, name
        accepted += int(res.accepted.sum())
        rejected += int((res.accepted < 3).sum())
    assert accepted > 0 and rejected > 0  # both branches of the rule ran
