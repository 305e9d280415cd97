"""The chains' device route writing its rows into reused blocks: the same bits as fresh tensors.

The verifiers of the device route (:func:`verify_chain_t` at ``K = 1``, :func:`verify_block_onestep_t`)
write the residual's rows, its running sums and the acceptances' minima into blocks kept across calls
(``work``) and the decoder draws its drafts with reused running sums. The independent route here is the
same verifier with fresh tensors (``work=None``, the operations of the code before the change): every
output, accepted length, acceptance and law is equal bit for bit, whatever the blocks held before; whole
decodes equal those of a decoder whose reused blocks are replaced by fresh tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.decoding as D  # noqa: E402
from otspec.decoding import _loop, _verifiers  # noqa: E402
from otspec.decoding._verifiers import verify_block_onestep_t, verify_chain_t  # noqa: E402
from tests.toy_lm import toy_target_draft  # noqa: E402

torch.set_num_threads(1)


def _laws(rng, rows, n, holes):
    x = rng.random((rows, n)) * (rng.random((rows, n)) >= holes)
    x[np.arange(rows), rng.integers(n, size=rows)] += 0.2
    return torch.from_numpy(x / x.sum(axis=1, keepdims=True))


def _dirty(work):
    for v in work.values():
        v.fill_(float("nan"))


@pytest.mark.parametrize("block", [False, True])
def test_chain_verifiers_into_reused_blocks_equal_fresh_tensors(block):
    """600 random blocks (holes, equal laws: no residual mass, every tau): the verifier with one ``work``
    dict across calls, its blocks filled with NaN before each call, returns the same tensors bit for bit
    as with fresh ones, from the same generator state; the blocks are allocated once per shape."""
    rng = np.random.default_rng(0)
    fn = verify_block_onestep_t if block else verify_chain_t
    work: dict = {}
    taus = set()
    for i in range(600):
        n, L = int(rng.integers(2, 9)), int(rng.integers(1, 5))
        P = _laws(rng, L, n, 0.4)[None]
        Q = _laws(rng, L + 1, n, 0.4)[None]
        if i % 5 == 0:
            Q[0, :L] = P[0]  # every draft accepted, or a residual without mass
        X = torch.from_numpy(np.array([[int(rng.choice(n, p=P[0, j].numpy())) for j in range(L)]]))
        seed = int(rng.integers(2**31))
        _dirty(work)
        got = fn(X, P, Q, torch.Generator().manual_seed(seed), work=work)
        want = fn(X, P, Q, torch.Generator().manual_seed(seed))
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
        taus.add(int(got[1]))
    assert taus == {0, 1, 2, 3, 4}
    ptrs = {k: v.data_ptr() for k, v in work.items() if isinstance(k[1], str) and len(k) == 3}
    assert ptrs, "the verifier wrote into no block of work"
    before = dict(ptrs)
    fn(X, P, Q, torch.Generator().manual_seed(1), work=work)
    assert {k: work[k].data_ptr() for k in before} == before  # reused, not allocated again


def _fresh_blocks(monkeypatch):
    """The decoder and verifiers with every reused block replaced by a fresh tensor (the code before)."""
    def fresh(work, name, shape, device, dtype=None):
        return torch.empty(shape, dtype=torch.float64 if dtype is None else dtype, device=device)

    monkeypatch.setattr(_loop, "_block", fresh)
    monkeypatch.setattr(_verifiers, "_block", fresh)
    monkeypatch.setattr(_loop, "_law_block", lambda block, shape, device, dtype=None: fresh(None, "", shape, device,
                                                                                              dtype))


SAMPLINGS = {
    "plain": {},
    "temperature-topk": {"temperature": 0.7, "top_k": 5},
    "topp": {"top_p": 0.8},
    "greedy": {"temperature": 0.0},
}


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("verifier", ["token", "block-onestep"])
def test_whole_decodes_equal_those_with_fresh_blocks(verifier, sampling, monkeypatch):
    """Whole decodes of the device route (2 seeds, L = 3, the last iteration shortened): tokens, accepted
    lengths and every logged prediction equal bit for bit those of the same decoder with fresh tensors."""
    target, draft = toy_target_draft(12)
    kw = dict(verifier=verifier, k=1, L=3, max_new_tokens=17, engine="torch", **SAMPLINGS[sampling])
    runs = {}
    for fresh in (False, True):
        with monkeypatch.context() as m:
            if fresh:
                _fresh_blocks(m)
            runs[fresh] = [D.speculative_decode([1, 2, 3], draft=draft, target=target, rng=s, **kw) for s in (0, 7)]
    for a, b in zip(runs[False], runs[True], strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.accepted, b.accepted)
        for name in ("predicted_accepted", "predicted_reached", "alpha_first", "alpha_opt_first"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
