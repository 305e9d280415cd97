"""experiments/gpu_tree_bound.py, the tree bound's device benchmark, run on the CPU with its tiny shape (no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import gpu_tree_bound as G  # noqa: E402

ROUTES = ("bound, the models on cpu", "bound, laws as float64 tensors on cpu", "bound, laws as numpy arrays on the host")


def _tables(out: str) -> list:
    """Each table's rows as ``{label prefix: cells}`` (the cells split at ``" | "``)."""
    tables = []
    for block in out.split("\n# ")[1:]:
        if "branching(8, 7)" not in block.split("\n")[0]:
            continue
        rows = {}
        for line in block.split("\n")[1:]:
            cells = [c.strip() for c in line.split(" | ")]
            for label in ("forward: ",) + ROUTES:
                if cells[0].startswith(label):
                    rows[label] = cells
        tables.append(rows)
    return tables


def test_tiny_run_prints_every_table_and_the_routes_agree():
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    got = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_tree_bound.py"), "--tiny"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    out = got.stdout
    assert got.returncode == 0, out + got.stderr
    assert "torch " in out.split("\n")[0] and "load average" in out.split("\n")[0] and " UTC" in out.split("\n")[0]
    tables = _tables(out)
    assert len(tables) == 4, out                    # iid and wor, at T = 1 and T = 0.08
    values = []
    for rows in tables:
        assert set(rows) == {"forward: "} | set(ROUTES), rows
        for label in ROUTES:
            cells = rows[label]
            ms, share, verdict = float(cells[1]), float(cells[3]), cells[4]
            assert ms > 0 and share > 0
            if label != ROUTES[0]:                  # the arithmetic's routes get a verdict against 0.10
                assert verdict == ("ok" if share <= G.TARGET else "MISS"), cells
        # the three routes' values, as printed (15 significant digits), agree to the stated 1e-12: read from the
        # table, not from the script's own verdict (a route that drifted, or a verdict computed on the wrong
        # values, fails here)
        v = np.array([float(rows[label][7]) for label in ROUTES])
        assert np.all(np.abs(v - v[0]) <= G.AGREE * v[0]), v
        assert all(float(rows[label][8]) <= G.AGREE for label in ROUTES[1:])
        assert int(rows[ROUTES[2]][5]) == 0 and int(rows[ROUTES[2]][6]) == 0   # the host route touches no tensor
        assert int(rows[ROUTES[1]][6]) > 0
        values.append(v[0])
    # T = 1 gives near-uniform laws: eight i.i.d. children cover the target at every depth (B = 2, the depth);
    # peaked laws at T = 0.08 give a bound below the depth: the sharpening reached the laws
    assert values[0] == pytest.approx(2.0, abs=1e-12) and values[2] < 1.9 and values[3] < 1.9
    assert out.count("agree (stated 1e-12)") == 5 and "DIFFER" not in out
    assert "mean entropy of the target's laws" in out and "# total" in out


def test_sharpen_divides_the_logits_and_leaves_the_tied_embedding():
    threads = torch.get_num_threads()
    try:
        d, t, keep = G.build_pair(G.SHAPES["tiny"], "cpu", "float32")
        norms = [m.model.norm.weight.detach().clone() for m in (d, t)]
        emb = t.model.embed_tokens.weight.detach().clone()
        ids = torch.tensor([[5, 9, 200, 31]])
        with torch.no_grad():
            base = [m(ids).logits.double() for m in (d, t)]
            G.sharpen((d, t), norms, 0.25)
            sharp = [m(ids).logits.double() for m in (d, t)]
        for b, s in zip(base, sharp):
            # logits / T up to float32 rounding; a sharpening that scaled the tied head (so the embedding too) or
            # one model alone fails this
            np.testing.assert_allclose(s.numpy(), 4.0 * b.numpy(), rtol=1e-4, atol=1e-6)
        assert torch.equal(t.model.embed_tokens.weight, emb) and t.lm_head.weight is t.model.embed_tokens.weight
        G.sharpen((d, t), norms, 1.0)                 # back to the built pair: the sharpening is not cumulative
        with torch.no_grad():
            assert torch.equal(t(ids).logits.double(), base[1])
    finally:
        torch.set_num_threads(threads)


def test_the_smollm2_shape_and_its_draft():
    from otspec.decoding.real import DEFAULT_KEEP

    s = G.SHAPES["smollm2-135m"]
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.intermediate, s.vocab, s.draft_layers) == (
        576, 30, 9, 3, 1536, 49_152, 24)
    d, t, keep = G.build_pair(s, "meta", "bfloat16")    # shapes only: no memory
    assert keep == DEFAULT_KEEP and len(d.model.layers) == 24 and len(t.model.layers) == 30
    assert t.lm_head.weight is t.model.embed_tokens.weight and d.lm_head.weight is d.model.embed_tokens.weight
    assert sum(p.numel() for p in t.parameters()) == 134_515_008       # SmolLM2-135M's parameter count
    assert t.model.embed_tokens.weight.dtype == torch.bfloat16
    # the tiny pair: the draft's every weight is the target's (its first layer, embedding, norm and head)
    d, t, keep = G.build_pair(G.SHAPES["tiny"], "cpu", "float32")
    assert keep == (0,)
    td = t.state_dict()
    for name, w in d.state_dict().items():
        assert torch.equal(w, td[name]), name


def test_bad_arguments_are_refused(capsys):
    for argv in (["--tiny", "--sharpen", "0"], ["--tiny", "--budget-s", "nan"], ["--tiny", "--repeat", "0"]):
        with pytest.raises(SystemExit) as e:
            G.main(argv)
        assert e.value.code == 2
    assert "--sharpen must be finite numbers > 0" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert G.main(["--device", "cuda"]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err


def test_a_spent_budget_starts_no_table(capsys):
    threads = torch.get_num_threads()
    try:
        assert G.main(["--tiny", "--budget-s", "0"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "# budget spent (0 s): skipped iid T=1, wor T=1, iid T=0.08, wor T=0.08" in out
    assert "bound, laws as" not in out and "# total" in out and "# pair built" in out


def test_a_failing_table_is_reported_and_the_others_still_run(capsys, monkeypatch):
    ran = []

    def run_table(*args):
        ran.append((args[7], args[9]))
        if len(ran) == 1:
            raise RuntimeError("a table that failed")
        return {"rel": 0.0}

    monkeypatch.setattr(G, "run_table", run_table)
    threads = torch.get_num_threads()
    try:
        assert G.main(["--tiny"]) == 1                # a failed table: exit status 1
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert ran == [("iid", 1.0), ("wor", 1.0), ("iid", 0.08), ("wor", 0.08)]
    assert "# part 'iid T=1' failed:" in out and "RuntimeError: a table that failed" in out
