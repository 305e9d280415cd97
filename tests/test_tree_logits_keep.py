"""A tree call computes its output layer at the root and the nodes only, not at the pending context's columns.

On the first iteration of tree decoding the pending columns are the whole prompt: at V = 128,256 and a 2,000-token
prompt, logits at every column are about 1 GiB of float32 for n + 1 rows wanted. :meth:`HFCausalLM.tree_logits`
passes transformers' ``logits_to_keep`` (as :meth:`HFCausalLM.logits` does with ``last``), so the output layer sees
``n + 1`` columns. Checked here: the rows the output layer sees (a forward hook on it), and the logits, bit for bit,
against the same call computing every column (the keyword withheld).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from otspec.decoding import HFCausalLM  # noqa: E402

V = 13
PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3], dtype=np.int64)


def _llama(seed):
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                   initializer_range=0.2)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval()


def _call(lm, prompt, tokens, rows, batch=1):
    seen = []
    hook = lm.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        state = lm.new_state()
        pending = np.array([prompt] * batch) if batch > 1 else prompt
        tok = np.array([tokens] * batch) if batch > 1 else tokens
        out = lm.tree_logits(state, PARENTS, tok, pending=pending, keep=rows)
    finally:
        hook.remove()
    return out, seen, state


@pytest.mark.parametrize("t0", [2, 9, 40])
@pytest.mark.parametrize("keep", [None, 4])
@pytest.mark.parametrize("batch", [1, 3])
def test_output_layer_at_the_tree_columns_only(t0, keep, batch):
    rng = np.random.default_rng(t0)
    prompt = rng.integers(0, V, size=t0).tolist()
    tokens = rng.integers(0, V, size=PARENTS.shape[0])
    tokens[0] = -1
    lm = HFCausalLM(_llama(1))
    assert lm._keep_kw is not None
    got, seen, state = _call(lm, prompt, tokens, None if keep is None else [keep] * batch if batch > 1 else keep,
                             batch)
    assert seen == [PARENTS.shape[0]]  # n + 1 columns, not t0 + n
    lm_all = HFCausalLM(_llama(1))
    lm_all._keep_kw = None  # the same model computing every column
    want, seen_all, state_all = _call(lm_all, prompt, tokens,
                                      None if keep is None else [keep] * batch if batch > 1 else keep, batch)
    assert seen_all == [t0 + PARENTS.shape[0] - 1]
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (state.length, state.batch) == (state_all.length, state_all.batch)
    # the next call on the state left behind is the same too
    nxt = lm.logits(state, torch.tensor([[5]] * batch))
    nxt_all = lm_all.logits(state_all, torch.tensor([[5]] * batch))
    torch.testing.assert_close(nxt, nxt_all, rtol=0, atol=0)
