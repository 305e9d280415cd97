"""Second-order toy language models for the decoding tests (torch, imported on use; cache-free CallableLM)."""

def table_fn(table):
    """Logits at position t depend on tokens t-1 and t: ``table[prev, ids]`` (token 0 before the first)."""

    import torch

    def fn(ids):
        prev = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], dim=1)
        return table[prev, ids]

    return fn


def toy_target_draft(V: int, *, seed: int = 0, named: bool = False):
    """A (target, draft) pair of second-order tables: target logits N(0, 1.5^2), draft = target + N(0, 0.8^2)."""
    import torch

    import otspec.decoding as D

    g = torch.Generator().manual_seed(seed)
    tq = torch.randn(V, V, V, generator=g, dtype=torch.float64) * 1.5
    tp = tq + 0.8 * torch.randn(V, V, V, generator=g, dtype=torch.float64)
    names = ({"name": "toy-target"}, {"name": "toy-draft"}) if named else ({}, {})
    return D.CallableLM(table_fn(tq), V, **names[0]), D.CallableLM(table_fn(tp), V, **names[1])


def tiny_llama(seed: int, *, vocab: int = 12):
    """A tiny random-weight ``transformers`` Llama (2 layers, hidden size 16, SDPA) as an ``HFCausalLM``: KV cache
    and tree masks on a real model class, in milliseconds."""
    import torch
    import transformers

    from otspec.decoding import HFCausalLM

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   initializer_range=0.3)
    torch.manual_seed(seed)
    return HFCausalLM(transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa").eval())
