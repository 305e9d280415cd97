"""Checkpoints at serving scale: loading a folder in a dtype on a device, and every bad input refused first.

Tiny random-weight ``LlamaForCausalLM`` models saved with ``save_pretrained`` to ``tmp_path`` (no tokenizer).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

import otspec.__main__ as cli  # noqa: E402
import otspec.decoding as D  # noqa: E402
from otspec.decoding import _models  # noqa: E402

torch.set_num_threads(1)


def _save(folder, *, vocab=16, layers=2, dtype=torch.float32, head_scale=1.0, seed=0):
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(seed)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(head_scale)
    m.to(dtype).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {"target": _save(root / "target", layers=2), "draft": _save(root / "draft", layers=1, seed=1),
            "bf16": _save(root / "bf16", dtype=torch.bfloat16), "other": _save(root / "other", vocab=20)}


@pytest.fixture
def no_weights(monkeypatch):
    """Loading weights fails the test: the errors under test come before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the error was reported")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize("dtype,expected", [("auto", torch.float32), ("bfloat16", torch.bfloat16),
                                            ("float16", torch.float16), ("float32", torch.float32)])
def test_from_pretrained_loads_a_folder_in_the_dtype(folders, dtype, expected):
    lm = D.HFCausalLM.from_pretrained(folders["target"], dtype=dtype)
    assert lm.model.dtype == expected and lm.vocab_size == 16 and lm.device == torch.device("cpu")
    assert lm.name == str(folders["target"])


def test_auto_is_the_checkpoint_s_own_dtype(folders):
    assert D.HFCausalLM.from_pretrained(folders["bf16"]).model.dtype == torch.bfloat16
    assert D.HFCausalLM.from_pretrained(folders["bf16"], dtype="float32").model.dtype == torch.float32


def test_token_ids_need_no_tokenizer_and_decode(folders):
    """The folders hold no tokenizer; the pair decodes token ids in bfloat16 on the device route."""
    assert not any(p.name.startswith("tokenizer") for p in folders["target"].iterdir())
    draft, target = _models.load_pair(folders["draft"], folders["target"], dtype="bfloat16")
    res = D.speculative_decode([1, 2, 3], draft=draft, target=target, L=3, max_new_tokens=12, rng=0)
    assert res.engine == "torch" and res.tokens.shape == (12,)


@pytest.mark.parametrize("kw,match", [
    ({"dtype": "half"}, r"`dtype` must be one of \('auto', 'bfloat16', 'float16', 'float32'\), got 'half'"),
    ({"dtype": "float64"}, r"`dtype`"),
    ({"device": "tpu:0"}, r"`device`='tpu:0' is not a device this machine has|`device` must name"),
    ({"device": "nonsense"}, r"`device` must name a torch device"),
    ({"draft_device": "nonsense"}, r"`draft_device` must name a torch device"),
])
def test_bad_dtype_and_device_before_any_load(folders, no_weights, kw, match):
    with pytest.raises(ValueError, match=match):
        _models.load_pair(folders["draft"], folders["target"], **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_it_before_any_load(folders, no_weights):
    with pytest.raises(ValueError, match=r"`device`='cuda', but this machine has no CUDA device"):
        _models.load_pair(folders["draft"], folders["target"], device="cuda")
    with pytest.raises(ValueError, match=r"`draft_device`='cuda:1', but this machine has no CUDA device"):
        _models.load_pair(folders["draft"], folders["target"], draft_device="cuda:1")


def test_vocabularies_that_differ_before_any_load(folders, no_weights):
    with pytest.raises(ValueError, match=r"share one vocabulary, got vocab_size 20 .* and 16"):
        _models.load_pair(folders["other"], folders["target"])


def test_float16_overflow_names_the_model_and_the_position(tmp_path):
    """A float16 target whose logits overflow to inf: a ValueError naming the model and the position."""
    t = _save(tmp_path / "hot", head_scale=1e6)
    target = D.HFCausalLM.from_pretrained(t, dtype="float16", name="hot-fp16")
    assert not torch.isfinite(target.logits(target.new_state(), torch.tensor([[1, 2]]))).all()
    draft = D.HFCausalLM.from_pretrained(t, dtype="float32", name="fine")
    with pytest.raises(ValueError, match=r"the target model 'hot-fp16' gave non-finite logits \(NaN or inf\) at "
                                         r"position 2 .*torch.float16: float16 overflows"):
        D.speculative_decode([1, 2], draft=draft, target=target, L=2, max_new_tokens=6, rng=0)


# --------------------------------------------------------------------------- the command line
def _cli(tmp_path, draft, target, *extra):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input_ids": [0, 1, 2]}\n{"input_ids": [3]}\n')
    return cli.main(["profile", "--draft", str(draft), "--target", str(target), "--prompts", str(prompts),
                     "--out", str(tmp_path / "run"), "--k-max", "1", "--L-max", "2", "--max-new-tokens", "3",
                     "--families", "token", "--no-progress", *extra])


def _error(capsys, match):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert re.search(match, err), err


@pytest.mark.parametrize("extra,match", [
    (["--dtype", "half"], r"argument --dtype: invalid choice: 'half'"),
    (["--device", "nonsense"], r"`--device` must name a torch device"),
    (["--draft-device", "nonsense"], r"`--draft-device` must name a torch device"),
] + ([] if torch.cuda.is_available() else [
    (["--device", "cuda"], r"`--device`='cuda', but this machine has no CUDA device"),
    (["--draft-device", "cuda:0"], r"`--draft-device`='cuda:0', but this machine has no CUDA device"),
]))
def test_command_line_refuses_before_loading(tmp_path, folders, no_weights, capsys, extra, match):
    assert _cli(tmp_path, folders["draft"], folders["target"], *extra) == 2
    _error(capsys, match)
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_command_line_refuses_different_vocabularies_before_loading(tmp_path, folders, no_weights, capsys):
    assert _cli(tmp_path, folders["other"], folders["target"]) == 2
    _error(capsys, r"must share one vocabulary, got vocab_size 20 and 16 \(read from their configs\)")


@pytest.mark.slow
def test_command_line_profiles_a_folder_without_tokenizer_in_bfloat16(tmp_path, folders, capsys):
    assert _cli(tmp_path, folders["draft"], folders["target"], "--dtype", "bfloat16") == 0
    assert (tmp_path / "run").is_dir()


def test_load_pair_of_the_command_line_takes_the_flags(folders, monkeypatch):
    """``_load_pair`` loads no tokenizer for token-id prompts and passes dtype and devices on."""
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("a tokenizer was loaded")))
    tok, d, t = cli._load_pair(str(folders["draft"]), str(folders["target"]), "cpu", dtype="float16",
                               draft_device="cpu", tokenizer=False)
    assert tok is None and d.model.dtype == t.model.dtype == torch.float16
    np.testing.assert_array_equal(d.vocab_size, t.vocab_size)
