"""experiments/gpu_check.py, the device check, run on the CPU with its tiny shape (nothing here needs a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import gpu_check  # noqa: E402


@pytest.mark.slow
def test_tiny_run_prints_every_part_of_the_table(capsys):
    assert gpu_check.main(["--tiny", "--budget-s", "600"]) == 0
    out = capsys.readouterr().out
    for row in ("forward: target 1 x 1 tokens", "forward: draft 2 x 1 tokens", "calibration: target 1 x 1 (plain)",
                "calibration: plain beyond fwd", "otspec autoregressive_decode", "(recommended)", "(runner-up)",
                "otspec topk:branching(2,2)", "transformers generate", "transformers assisted L = ",
                "# profile overhead, k_max = L_max = 4", "\nnone | ", "iid:branching(4,2):specinfer | "):
        assert row in out, row
    assert "failed" not in out
    assert "cost violations:" in out and "# total" in out


@pytest.mark.slow
def test_a_spent_budget_still_prints_the_parts_measured(capsys):
    assert gpu_check.main(["--tiny", "--budget-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "forward: target 1 x 1 tokens" in out and "calibration: target 1 x 1 (plain)" in out
    assert "budget spent: decoders skipped" in out and "budget spent: transformers skipped" in out
    assert "budget spent: profile overhead skipped" in out


def test_a_missing_device_is_refused_before_any_model_is_built(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_named_shapes():
    s = gpu_check.SHAPES["llama-3.2-1b"]
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, s.vocab, s.draft_layers, s.dtype) == (
        2048, 16, 32, 8, 8192, 128_256, 4, "bfloat16")
    d, t = gpu_check.build_pair(gpu_check.SHAPES["tiny"], "cpu")
    assert len(d.model.layers) == 1 and len(t.model.layers) == 2
    for name, w in d.state_dict().items():  # the draft is the target's embedding, first layer, norm and head
        assert (w == t.state_dict()[name]).all(), name


@pytest.mark.slow
def test_profile_only_runs_the_forward_passes_and_the_profile_overhead(capsys):
    assert gpu_check.main(["--tiny", "--profile-only"]) == 0
    out = capsys.readouterr().out
    assert "forward: target 1 x 1 tokens" in out and "\nnone | " in out and "iid:branching(4,2):specinfer | " in out
    assert "calibration:" not in out and "otspec autoregressive_decode" not in out and "failed" not in out
    assert "aten ops per position outside the forward passes" in out and "trees subsampled " in out
