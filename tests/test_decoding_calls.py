"""The decoder's forward calls on a Hugging Face pair: how many per iteration, how many tokens each is fed and
how many positions of logits each computes (counted by forward hooks on the models themselves, as the benchmark
``experiments/bench_decode_overhead.py`` counts transformers' assisted generation).

A chain iteration (``k = 1``, draft length ``L``) makes ``L`` draft calls of one new token each (two after a full
acceptance: the last draft and the bonus token) and one target call of ``L + 1`` tokens; every call computes the
output layer at the positions the decoder reads only -- one per draft call, ``L + 1`` per target call, the
prompt's prefill included (transformers' ``logits_to_keep``, as its ``generate`` asks for).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import otspec.decoding as D  # noqa: E402
from otspec.decoding._models import takes_last  # noqa: E402

torch.set_num_threads(1)
V = 11
PROMPT = [1, 4, 2, 7, 3, 9, 5, 0, 6]


def _tiny_llama(seed, layers=2, vocab=V):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger logits than the default init, so drafts get rejected as well as accepted
        m.lm_head.weight.mul_(8.0)
    return m


class Calls:
    """Forward hooks on a torch module: ``(tokens fed, positions of logits returned)`` of every call, per row (and
    the rows of every call in ``rows``: a draft tree's frontier is a batch of rows)."""

    def __init__(self, module):
        self.log: list[tuple[int, int]] = []
        self.rows: list[int] = []
        self._fed = 0
        self._hooks = [module.register_forward_pre_hook(self._pre, with_kwargs=True),
                       module.register_forward_hook(self._post, with_kwargs=True)]

    def _pre(self, module, args, kwargs):
        self._fed = int(kwargs["input_ids"].shape[1])
        self.rows.append(int(kwargs["input_ids"].shape[0]))

    def _post(self, module, args, kwargs, out):
        self.log.append((self._fed, int(out.logits.shape[1])))

    def remove(self):
        for h in self._hooks:
            h.remove()


@pytest.fixture(scope="module")
def pair():
    target = _tiny_llama(3, layers=3)
    return target, D.layer_skip_draft(target, [0, 2])


def _counted(pair, run, draft_rows: list | None = None):
    """``run(target, draft)``'s result and the calls of both models; ``draft_rows`` receives the draft's rows."""
    target, draft = pair
    ct, cd = Calls(target), Calls(draft)
    try:
        res = run(D.HFCausalLM(target), D.HFCausalLM(draft))
    finally:
        ct.remove()
        cd.remove()
    if draft_rows is not None:
        draft_rows.extend(cd.rows)
    return res, ct.log, cd.log


def _split(calls, lengths, per_iteration):
    """``calls`` (a hooked model's log) cut into the iterations, ``per_iteration(i, L_i)`` calls each."""
    out, at = [], 0
    for i, n in enumerate(lengths):
        c = per_iteration(i, int(n))
        out.append(calls[at : at + c])
        at += c
    assert at == len(calls)
    return out


def _expected_lengths(res, L, max_new):
    """``L_i = min(L, left - 1)`` from the tokens each iteration made before it."""
    made = np.concatenate([[0], np.cumsum(res.emitted)[:-1]])
    return np.minimum(L, max_new - made - 1)


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("L", [1, 2, 4])
def test_chain_calls_per_iteration_and_logits_computed(pair, engine, L):
    """``L_i`` draft calls and one target call per iteration (``L_i = L`` but in the last iterations); one position
    of logits per draft call and ``L_i + 1`` per target call, the prefills included (before: every prompt position
    of both models, and two positions of the draft's first call after a full acceptance)."""
    for seed in range(3):
        res, tcalls, dcalls = _counted(pair, lambda t, d, seed=seed: D.speculative_decode(
            PROMPT, draft=d, target=t, verifier="token", L=L, max_new_tokens=12, rng=seed, engine=engine))
        lengths = res.draft_lengths
        np.testing.assert_array_equal(lengths, _expected_lengths(res, L, 12))
        assert len(tcalls) == res.iterations and len(dcalls) == lengths.sum()
        assert tcalls[0] == (len(PROMPT) + lengths[0], lengths[0] + 1)  # the prefill rides on the first target call
        assert all(c == (1 + n, n + 1) for c, n in zip(tcalls[1:], lengths[1:]))
        assert dcalls[0] == (len(PROMPT), 1)
        assert all(rows == 1 and fed in (1, 2) for fed, rows in dcalls[1:])
        # the first draft call of an iteration is fed two tokens exactly after a full acceptance
        per = _split(dcalls, lengths, lambda i, n: n)
        full = [int(a) == int(n) for a, n in zip(res.accepted[:-1], lengths[:-1])]
        assert [c[0][0] for c in per[1:] if c] == [2 if f else 1 for f, c in zip(full, per[1:]) if c]


#: Every chain family the loop dispatches (``(verifier, k)``) with its routes: the token-level rules (SpecTr's
#: DraftSelection with the package's verifiers on the host, the device's chain verifier), the block verifiers
#: (Sun et al.'s v1 with its residual calls, one-step), and the enumerated multi-draft block ones.
FAMILIES = [("token", 1, "numpy"), ("token", 1, "torch"), ("kseq", 2, "numpy"), ("multiround", 2, "numpy"),
            ("multiround", 2, "torch"), ("optimal", 2, "numpy"), ("block", 1, "numpy"),
            ("block-onestep", 1, "numpy"), ("block-onestep", 1, "torch"),
            pytest.param("multidraft-plan", 2, "numpy", marks=pytest.mark.slow)]  # about a minute: its LP
# ("multidraft-one-token" shares multidraft-plan's loop; its LP over the 121 blocks of this pair at L = 2 took
# minutes at some seeds, before the change as after it)


@pytest.mark.parametrize("verifier, k, engine", FAMILIES)
def test_last_iterations_draft_what_is_left(pair, verifier, k, engine):
    """With ``left`` tokens to make, an iteration drafts ``L_i = min(L, left - 1)`` tokens, each draft call fed one
    token (two after a full acceptance) and the target call ``L_i`` drafts (``L_i + 1`` positions of logits), and
    makes no token past ``max_new_tokens``; one token left: plain decoding's step, one target call and no draft
    (before: ``L`` drafts in every iteration, the surplus thrown away)."""
    multiblock = verifier.startswith("multidraft")
    L = 2 if multiblock else 3  # the enumerated schemes query V**j prefixes at depth j
    for max_new in (1, 2, L, L + 2, 2 * L + 3):
        for seed in range(2):
            res, tcalls, dcalls = _counted(pair, lambda t, d, seed=seed, m=max_new: D.speculative_decode(
                PROMPT, draft=d, target=t, verifier=verifier, k=k, L=L, max_new_tokens=m, rng=seed, engine=engine))
            lengths = res.draft_lengths
            assert res.engine == engine and res.tokens.shape[0] == max_new == res.emitted.sum()
            np.testing.assert_array_equal(lengths, _expected_lengths(res, L, max_new))
            assert lengths[-1] < L or max_new > L  # the last iteration is short whenever the run is
            assert all(int(a) <= int(n) for a, n in zip(res.accepted, lengths))
            if max_new == 1:  # plain decoding's step
                assert tcalls == [(len(PROMPT), 1)] and dcalls == []
                continue
            if multiblock:  # every draft prefix of length < L_i queried, one call each
                assert len(dcalls) == sum(sum(V**j for j in range(n)) for n in lengths)
                continue
            tper = _split(tcalls, lengths, lambda i, n, r=res: int(r.target_calls[i]))
            dper = _split(dcalls, lengths, lambda i, n: n)
            for i, (n, tc, dc) in enumerate(zip(lengths, tper, dper)):
                head = len(PROMPT) if i == 0 else 1
                assert tc[0] == (head + n, n + 1)  # the scoring call: L_i drafts, L_i + 1 laws
                assert len(dc) == n and all(rows == 1 for _, rows in dc)
                assert all(fed == 1 for fed, _ in dc[1:])
                if i == 0 and dc:
                    assert dc[0][0] == len(PROMPT)  # the draft's prefill
                elif dc:
                    assert dc[0][0] == (2 if int(res.accepted[i - 1]) == int(lengths[i - 1]) else 1)


def test_a_lossy_verifier_keeps_its_draft_length(pair):
    """A verifier that is not lossless drafts ``L`` to the end (its output law depends on ``L``): no shortening."""
    for max_new in (1, 5):
        res, tcalls, dcalls = _counted(pair, lambda t, d, m=max_new: D.speculative_decode(
            PROMPT, draft=d, target=t, verifier="mentored", verifier_options={"D": 0.1}, L=3, max_new_tokens=m,
            rng=0))
        assert not res.lossless and (res.draft_lengths == 3).all() and len(dcalls) == 3 * res.iterations
        assert res.tokens.shape[0] == max_new


def test_multidraft_block_and_plain_calls(pair):
    """``k = 3`` drafts: ``k (L_i + 1)`` target rows of logits at the last ``L_i + 1`` positions; the block verifier
    (the host route) and plain decoding ask for the positions they read as well."""
    L, k = 2, 3
    res, tcalls, dcalls = _counted(pair, lambda t, d: D.speculative_decode(
        PROMPT, draft=d, target=t, verifier="kseq", k=k, L=L, max_new_tokens=10, rng=0))
    assert len(tcalls) == res.iterations and [rows for _, rows in tcalls] == list(res.draft_lengths + 1)
    assert res.draft_lengths[0] == L
    assert all(rows == 1 for _, rows in dcalls)
    res, tcalls, dcalls = _counted(pair, lambda t, d: D.speculative_decode(
        PROMPT, draft=d, target=t, verifier="block", L=L, max_new_tokens=10, rng=0))
    assert tcalls[0] == (len(PROMPT) + L, L + 1) and all(rows == 1 for _, rows in dcalls)
    res, tcalls, _ = _counted(pair, lambda t, d: D.autoregressive_decode(t, PROMPT, max_new_tokens=6, rng=0))
    assert tcalls == [(len(PROMPT), 1)] + [(1, 1)] * 5


def test_last_gives_the_last_positions_and_keeps_the_whole_cache(pair):
    target, _ = pair
    lm = D.HFCausalLM(target)
    full_state, kept_state = lm.new_state(), lm.new_state()
    ids = torch.tensor([PROMPT])
    full = lm.logits(full_state, ids)
    for m in (1, 3, len(PROMPT)):
        s = lm.new_state()
        got = lm.logits(s, ids, last=m)
        assert got.shape == (1, m, V) and s.length == len(PROMPT)
        torch.testing.assert_close(got, full[:, -m:], rtol=0, atol=1e-5)
    lm.logits(kept_state, ids, last=1)
    nxt = torch.tensor([[8, 2]])  # the cache after last= holds every position: the next call agrees
    torch.testing.assert_close(lm.logits(kept_state, nxt), lm.logits(full_state, nxt), rtol=0, atol=1e-5)
    # CallableLM slices its function's output
    fn = D.CallableLM(lambda x: torch.nn.functional.one_hot(x, V).double(), vocab_size=V)
    got = fn.logits(fn.new_state(), ids, last=2)
    assert torch.equal(got, torch.nn.functional.one_hot(ids[:, -2:], V).double())


class _NoKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (the adapter slices after the call)."""

    def __init__(self, m):
        super().__init__()
        self.m, self.config = m, m.config

    def get_output_embeddings(self):
        return self.m.get_output_embeddings()

    def forward(self, input_ids, cache=None, use_cache=True):
        return self.m(input_ids=input_ids, cache=cache, use_cache=use_cache)


def test_last_without_logits_to_keep_slices(pair):
    target, _ = pair
    lm, ref = D.HFCausalLM(_NoKeep(target)), D.HFCausalLM(target)
    ids = torch.tensor([PROMPT])
    got = lm.logits(lm.new_state(), ids, last=2)
    assert got.shape == (1, 2, V)
    torch.testing.assert_close(got, ref.logits(ref.new_state(), ids)[:, -2:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("last, err, match", [(0, ValueError, r"\[1, 3\].*got 0"), (4, ValueError, "got 4"),
                                               (1.5, TypeError, "float"), (True, TypeError, "bool")])
def test_bad_last_is_refused_before_the_call(pair, last, err, match):
    target, _ = pair
    for lm in (D.HFCausalLM(target), D.CallableLM(lambda x: torch.zeros(x.shape + (V,)), vocab_size=V)):
        state = lm.new_state()
        with pytest.raises(err, match=match):
            lm.logits(state, torch.tensor([[1, 2, 3]]), last=last)
        assert lm.n_calls == 0


class _Plain:
    """A wrapper whose ``logits`` takes no keywords."""

    def __init__(self, lm):
        self.lm = lm

    def logits(self, state, ids):
        return self.lm.logits(state, ids)


class _Passing:
    """A wrapper passing every keyword on to ``self.lm`` (as the profile's timed models)."""

    def __init__(self, lm):
        self.lm = lm

    def logits(self, *args, **kwargs):
        return self.lm.logits(*args, **kwargs)


def test_takes_last(pair):
    hf = D.HFCausalLM(pair[0])
    assert takes_last(hf) and takes_last(_Passing(hf)) and takes_last(_Passing(_Passing(hf)))
    assert not takes_last(_Plain(hf)) and not takes_last(_Passing(_Plain(hf))) and not takes_last(object())


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("tree", ["topk:branching(2,2)", "eagle2:3,2,5", "iid:branching(2,2):specinfer",
                                  "wor:branching(2,2):sequoia"])
def test_tree_draft_calls_compute_one_position_per_row(pair, engine, tree):
    """A draft tree's draft calls read the last position of every row only, and ask for it alone (before: every
    prompt position at the draft's first call, and every fed token after a full acceptance); the target's tree
    call scores every node."""
    res, tcalls, dcalls = _counted(pair, lambda t, d: D.speculative_decode(
        PROMPT, draft=d, target=t, tree=tree, max_new_tokens=10, rng=0, engine=engine))
    assert res.iterations >= 2 and len(tcalls) == res.iterations
    assert dcalls[0] == (len(PROMPT), 1)
    assert all(rows == 1 for _, rows in dcalls)


def _nodes_to_depth(tree: str, n: int) -> int:
    """The draft nodes of depth at most ``n`` that ``tree`` (the profile's text) drafts: a static shape's nodes of
    depth <= n; EAGLE-2's ``topk + (n - 1) topk**2`` proposals of its first ``n`` levels, at most its budget."""
    import otspec.tree as T
    from otspec.decoding._tree_loop import TREE_PROCESSES

    spec = T.parse_tree_spec(tree, "tree", processes=TREE_PROCESSES)
    s = spec.shape
    if spec.process == "eagle2":
        return min(s.n, s.topk + (n - 1) * s.topk**2)
    return sum(1 for p in s.paths if 0 < len(p) <= n)


def _frontier(tree: str, j: int) -> int:
    """The rows of the draft's call at depth ``j``: the root's one, then the nodes of depth ``j`` with children
    (EAGLE-2's ``topk`` best of its level)."""
    import otspec.tree as T
    from otspec.decoding._tree_loop import TREE_PROCESSES

    spec = T.parse_tree_spec(tree, "tree", processes=TREE_PROCESSES)
    if j == 0:
        return 1
    if spec.process == "eagle2":
        return spec.shape.topk
    return len({p[:j] for p in spec.shape.paths if len(p) == j + 1})


#: Every tree family the decoder drafts, depth 3: top-k, EAGLE-2 (its budget of 9 nodes more than its first level
#: proposes), i.i.d. (SpecInfer) and without replacement (Sequoia) on balanced and explicit rank-path shapes, SpecHub.
TREE_FAMILIES = ["topk:branching(2,2,1)", "eagle2:3,2,10", "iid:branching(2,2,1):specinfer",
                 "iid:[[0],[1],[0,0],[0,1],[1,0],[0,0,0]]:specinfer", "wor:branching(2,2,1):sequoia",
                 "wor:[[0],[1],[2],[0,0],[1,0],[0,0,0]]:sequoia", "spechub:branching(2,2,1)"]


@pytest.mark.parametrize("engine", ["torch", "numpy"])
@pytest.mark.parametrize("tree", TREE_FAMILIES)
def test_tree_last_iterations_draft_the_levels_left(pair, tree, engine):
    """With ``left`` tokens to make, a tree iteration drafts the tree's first ``D_i = min(D, left - 1)`` levels only:
    ``D_i`` draft calls (one per level, each on the frontier's rows as in a whole tree), and a target call that
    scores the nodes of depth at most ``D_i`` (fed the pending tokens and those nodes), so no token is made past
    ``max_new_tokens``; one token left: plain decoding's step, one target call of one position, no draft (before:
    every iteration drafted and scored the whole tree, its surplus thrown away)."""
    if engine == "torch" and tree.startswith("spechub"):
        pytest.skip("SpecHub's trees run on the host route only")
    D_ = 3
    for max_new in (1, 2, D_, D_ + 2, 2 * D_ + 3):
        for seed in range(2):
            rows: list = []
            res, tcalls, dcalls = _counted(pair, lambda t, d, seed=seed, m=max_new: D.speculative_decode(
                PROMPT, draft=d, target=t, tree=tree, max_new_tokens=m, rng=seed, engine=engine), rows)
            lengths = res.draft_lengths
            assert res.engine == engine and res.L == D_ and res.lossless
            assert res.tokens.shape[0] == max_new == res.emitted.sum()
            np.testing.assert_array_equal(lengths, _expected_lengths(res, D_, max_new))
            assert all(int(a) <= int(n) for a, n in zip(res.accepted, lengths))
            assert len(tcalls) == res.iterations and len(dcalls) == lengths.sum() == res.draft_calls
            per = _split(list(zip(dcalls, rows)), lengths, lambda i, n: n)
            for i, (n, (fed, _), dc) in enumerate(zip(lengths, tcalls, per)):
                head = len(PROMPT) if i == 0 else int(res.emitted[i - 1])  # the target's pending tokens
                if n == 0:  # plain decoding's step: the last iteration, one position of logits
                    assert i == res.iterations - 1 and tcalls[i] == (head, 1) and dc == []
                    continue
                assert fed == head + _nodes_to_depth(tree, int(n))  # the nodes of depth <= D_i, none deeper
                full = _nodes_to_depth(tree, D_)
                assert (fed - head < full) == (n < D_) or tree.startswith("eagle2")
                assert [r for _, r in dc] == [_frontier(tree, j) for j in range(n)]  # rows as in a whole tree

