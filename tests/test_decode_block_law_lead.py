"""The decoder's numpy route logs the law of ``tau`` along each block by the verifier's own formula, on its own float64
rows: the same bits as :func:`otspec.block.tau_law_on_path` on those rows, without checking each row a second time
(the public function checks rows it did not form)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import otspec.block as blk  # noqa: E402
import otspec.block._verifiers as BV  # noqa: E402
import otspec.decoding as D  # noqa: E402

V = 24


def _tiny(seed, layers):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(30.0)
    return m


@pytest.fixture(scope="module")
def pair():
    return D.HFCausalLM(_tiny(3, 1)), D.HFCausalLM(_tiny(4, 2))


@pytest.mark.parametrize("verifier", ["block-onestep", "block"])  # the block kinds: _iter_block logs their law
def test_logged_law_is_the_public_functions_without_a_second_check(pair, verifier, monkeypatch):
    draft, target = pair
    cls = blk.make_verifier.__globals__["_block_class"](verifier)
    seen = []
    inner = cls._path_tau_law

    def recording(block, cs, cb):
        out = inner(block, cs, cb)
        seen.append((tuple(block), [np.array(r) for r in cs], [np.array(r) for r in cb], out.copy()))
        return out

    checks = []
    real_check = BV._path_laws
    monkeypatch.setattr(cls, "_path_tau_law", staticmethod(recording))
    monkeypatch.setattr(BV, "_path_laws", lambda *a: checks.append(a) or real_check(*a))
    res = D.speculative_decode([1, 2], draft=draft, target=target, verifier=verifier, L=3, max_new_tokens=12,
                               rng=5, engine="numpy")
    assert len(res.tokens) == 12
    assert seen and not checks                   # a law per iteration, no row checked again
    monkeypatch.undo()
    for block, cs, cb, law in seen:              # the public, checking route on the same rows: the same bits
        assert all(r.dtype == np.float64 for r in cs + cb)
        got = blk.tau_law_on_path(verifier, block, cs, cb)
        assert np.array_equal(got, law), (block, got, law)
        assert got.sum() == pytest.approx(1.0, abs=1e-12)
