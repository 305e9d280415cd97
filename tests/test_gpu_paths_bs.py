"""The branches taken only on CUDA, exercised on the CPU: ``torch.cuda``'s functions monkeypatched (counting
synchronisations, a chosen free memory, a named card) and the device only named, never allocated on. Also the
device check's scripts (``experiments/gpu_check.py``, ``experiments/gpu_profile_walk.py``): their arguments, each
part's failure caught and printed without losing the parts already printed, and their files under ``--out``."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import gpu_check  # noqa: E402
import gpu_profile_walk  # noqa: E402

import otspec.decoding._loop as _loop  # noqa: E402
from otspec._timing import Stopwatch, synchronize, timed_rounds  # noqa: E402
from otspec.decoding import CallableLM, speculative_decode  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from otspec.profile._collect import check_device_memory, device_law_bytes  # noqa: E402
from otspec.profile._store import machine_entry  # noqa: E402


@pytest.fixture
def fake_cuda(monkeypatch):
    """``torch.cuda`` of a machine with ``n`` cards (default 1): synchronisations recorded with their device,
    ``mem_get_info`` answering ``free`` bytes (settable), ``get_device_name`` a card's name."""
    class Fake:
        n = 1
        free = 2**30
        syncs: list = []
        mem_asked: list = []

    fake = Fake()
    fake.syncs, fake.mem_asked = [], []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: fake.n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.n)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: fake.syncs.append(device))
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda device=None: fake.mem_asked.append(device) or (fake.free, 2**36))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"Fake H200 ({device})")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return fake


# --------------------------------------------------------------------------- otspec/_timing.py
def test_synchronize_waits_for_the_named_cuda_device(fake_cuda):
    synchronize("cuda:1")
    synchronize(torch.device("cuda", 0))
    synchronize("cpu")
    synchronize(None)
    assert fake_cuda.syncs == ["cuda:1", torch.device("cuda", 0)]


def test_stopwatch_and_rounds_on_cuda_synchronise_around_every_section(fake_cuda):
    sw = Stopwatch("cuda")
    with sw:
        pass
    with sw:
        pass
    assert len(fake_cuda.syncs) == 4 and sw.count == 2
    fake_cuda.syncs.clear()
    got = timed_rounds({"a": lambda: None, "b": lambda: None}, device=torch.device("cuda:0"), warmup=1, repeats=2)
    assert len(fake_cuda.syncs) == 2 * 2 * 3 and all(s == torch.device("cuda:0") for s in fake_cuda.syncs)
    assert all(len(t.samples) == 2 for t in got.values())


# --------------------------------------------------------------------------- otspec/decoding
def test_decoder_clock_synchronises_each_cuda_device_once(fake_cuda):
    t0 = _loop._clock(torch.device("cuda:0"), None, torch.device("cpu"), torch.device("cuda:1"))
    assert isinstance(t0, float) and fake_cuda.syncs == [torch.device("cuda:0"), torch.device("cuda:1")]


def test_law_memory_guard_reads_the_cuda_devices_free_memory(fake_cuda):
    V, k, L = 1000, 2, 3
    need = _loop.law_bytes(V, k, L)
    peak = need + 8 * V * k * (L + 1)
    assert need == 8 * V * k * (2 * L + 1)
    devs = {torch.device("cuda:0"), torch.device("cpu")}
    fake_cuda.free = peak  # exactly fits: the softmax's temporary counted
    _loop._check_law_memory(V, k, L, devs)
    assert fake_cuda.mem_asked == [torch.device("cuda:0")]
    fake_cuda.free = peak - 1
    with pytest.raises(ValueError, match=r"free on the device.*smaller `k` or `L`"):
        _loop._check_law_memory(V, k, L, devs)
    fake_cuda.mem_asked.clear()
    _loop._check_law_memory(V, k, L, {torch.device("cpu")})  # the CPU: no free memory read
    assert fake_cuda.mem_asked == []


def test_speculative_decode_refuses_laws_above_a_cuda_devices_free_memory_before_any_model_call(fake_cuda):
    calls = []

    def fn(ids):
        calls.append(ids.shape)
        return torch.zeros(ids.shape + (50,))

    draft, target = CallableLM(fn, 50, device="cuda:0"), CallableLM(fn, 50, device="cuda:0")
    fake_cuda.free = 1000
    with pytest.raises(ValueError, match="free on the device"):
        speculative_decode([1], draft=draft, target=target, verifier="kseq", k=2, L=3, rng=0)
    assert calls == [] and fake_cuda.mem_asked


# --------------------------------------------------------------------------- otspec/profile: the memory guard
def test_profile_memory_guard_reads_the_free_memory_of_a_cuda_device(fake_cuda):
    s = ProfileSettings(k_max=2, L_max=3, max_new_tokens=4, batch_size=2, families=["token"], verifiers=["token"])
    V, lengths = 5000, [3, 7]
    parts = device_law_bytes(s, V, lengths)
    B = 2
    assert parts["blocks"] == B * 2 * (2 * 3 + 1) * V * 8
    assert parts["first call"] == B * 2 * (7 + 3 + 1) * V * 4
    need = sum(parts.values())
    fake_cuda.free = need
    check_device_memory(s, V, lengths, torch.device("cuda:0"))
    assert fake_cuda.mem_asked == [torch.device("cuda:0")]
    fake_cuda.free = need - 1
    with pytest.raises(ValueError, match=r"above its free memory.*lower `batch_size`"):
        check_device_memory(s, V, lengths, torch.device("cuda:0"))
    fake_cuda.mem_asked.clear()
    check_device_memory(s, V, lengths, None)
    check_device_memory(s, V, lengths, torch.device("cpu"))
    assert fake_cuda.mem_asked == []
    with pytest.raises(ValueError, match="free memory"):  # a free memory given: checked on any device
        check_device_memory(s, V, lengths, torch.device("cpu"), free=need - 1)


def test_machine_entry_names_the_cuda_card(fake_cuda):
    e = machine_entry({"draft": "cpu", "target": torch.device("cuda:0")})
    assert e["devices"] == {"draft": "cpu", "target": "cuda:0"} and e["device_name"].startswith("Fake H200")
    assert machine_entry({"draft": "cpu", "target": "cpu"})["device_name"] != "Fake H200"


# --------------------------------------------------------------------------- experiments/gpu_check.py
def test_gpu_check_device_argument(fake_cuda, monkeypatch, capsys):
    assert gpu_check.check_device_arg("cuda:0") is None and gpu_check.check_device_arg("cuda") is None
    why = gpu_check.check_device_arg("cuda:3")
    assert "--device" in why and "cuda:3" in why and "1 CUDA device" in why
    assert "--device" in gpu_check.check_device_arg("no-such-device")
    assert gpu_check.device_card("cuda:0") == "Fake H200 (cuda:0)"
    monkeypatch.setattr(gpu_check, "build_pair", lambda *a, **k: pytest.fail("built a pair for a bad device"))
    assert gpu_check.main(["--device", "cuda:3"]) == 2
    assert "cuda:3" in capsys.readouterr().err
    fake_cuda.n = 0
    assert "torch sees no CUDA device" in gpu_check.check_device_arg("cuda")


@pytest.mark.parametrize("budget", ["-1", "nan", "inf"])
def test_gpu_check_refuses_a_budget_that_is_no_duration(budget, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--tiny", "--budget-s", budget])
    assert exc.value.code == 2 and "--budget-s" in capsys.readouterr().err


def _tiny_bf16(monkeypatch):
    import dataclasses

    monkeypatch.setitem(gpu_check.SHAPES, "tiny", dataclasses.replace(gpu_check.SHAPES["tiny"], dtype="bfloat16"))


@pytest.mark.slow
def test_gpu_check_in_bfloat16_the_real_shapes_dtype_runs_every_part(monkeypatch, capsys):
    """The serving shape runs in bfloat16 on the device; the tiny one in float32. Here the tiny one in bfloat16
    on the CPU: a dtype mismatch between bfloat16 logits and the float64 laws fails here, not on the lent GPU."""
    _tiny_bf16(monkeypatch)
    d, t = gpu_check.build_pair(gpu_check.SHAPES["tiny"], "cpu")
    assert {p.dtype for p in (*d.parameters(), *t.parameters())} == {torch.bfloat16}
    assert gpu_check.main(["--tiny", "--budget-s", "600"]) == 0
    out = capsys.readouterr().out
    for row in ("forward: target 2 x 3 tokens", "calibration: plain beyond fwd", "otspec autoregressive_decode",
                "(recommended)", "otspec topk:branching(2,2)", "\nnone | ", "transformers assisted L = "):
        assert row in out, row
    assert "failed" not in out and "Traceback" not in out


@pytest.mark.slow
def test_gpu_check_a_failed_profile_keeps_the_forward_rows_and_runs_the_profile_overhead(monkeypatch, capsys):
    import otspec.profile

    def broken(*a, **k):
        raise RuntimeError("profile broke on the device")

    monkeypatch.setattr(otspec.profile, "profile", broken)
    monkeypatch.setattr(gpu_check, "_profile_overhead", lambda *a: print("overhead ran", flush=True))
    assert gpu_check.main(["--tiny", "--budget-s", "600"]) == 0
    out = capsys.readouterr().out
    assert "forward: target 1 x 1 tokens" in out and "forward: draft 2 x 1 tokens" in out
    assert "# part 'calibration' failed" in out and "profile broke on the device" in out
    assert "overhead ran" in out and "# total" in out
    assert "calibration: target" not in out and "otspec autoregressive_decode" not in out


@pytest.mark.slow
def test_gpu_check_a_failed_part_is_printed_and_the_later_parts_still_run(monkeypatch, capsys):
    import otspec.profile._check

    def broken(*a, **k):
        raise RuntimeError("decoders broke on the device")

    monkeypatch.setattr(otspec.profile._check, "check_decodes", broken)
    monkeypatch.setattr(gpu_check, "_profile_overhead", lambda *a: print("overhead ran", flush=True))

    def forward_broken(*a, **k):
        a[-1].append(("half a row",))
        raise RuntimeError("forward broke")

    monkeypatch.setattr(gpu_check, "_forward_rows", forward_broken)
    assert gpu_check.main(["--tiny", "--budget-s", "600"]) == 0
    out = capsys.readouterr().out
    assert "# part 'forward' failed" in out and "half a row" not in out  # a failed part's rows are not printed
    assert "calibration: target 1 x 1 (plain)" in out and "# part 'decoders' failed" in out
    assert "decoders broke on the device" in out and "overhead ran" in out
    assert "transformers generate" in out and "transformers assisted L = " in out and "# total" in out


@pytest.mark.slow
def test_gpu_check_keep_leaves_the_two_profiles_under_the_folder(tmp_path, capsys):
    keep = tmp_path / "kept"
    assert gpu_check.main(["--tiny", "--profile-only", "--keep", str(keep)]) == 0
    assert "failed" not in capsys.readouterr().out
    assert sorted(p.name for p in keep.iterdir()) == ["chains", "trees"]
    for sub in ("chains", "trees"):
        assert (keep / sub / "manifest.json").is_file()


# --------------------------------------------------------------------------- experiments/gpu_profile_walk.py
def test_profile_walk_syncs_the_named_device_and_asks_for_its_activities(fake_cuda):
    from torch.profiler import ProfilerActivity

    gpu_profile_walk.sync_for("cuda:1")()
    gpu_profile_walk.sync_for("cpu")()
    assert fake_cuda.syncs == ["cuda:1"]
    assert gpu_profile_walk.profiler_activities("cuda:0") == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    assert gpu_profile_walk.profiler_activities("cpu") == [ProfilerActivity.CPU]


def test_profile_walk_tables_of_a_cuda_run_fall_back_to_the_keys_this_torch_has():
    """On CUDA the tables sort by device time first: the key's name differs between torch versions; here a CPU
    profile's averages asked as on CUDA give every table this torch can sort, the host's last."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        torch.ones(3).add_(1)
    parts = gpu_profile_walk.profiler_tables(tp.key_averages(), "cuda:0", 5)
    assert parts and parts[-1].startswith("## sorted by self_cpu_time_total\n")
    assert len(parts) in (1, 2) and all("aten::" in p for p in parts)
    cpu = gpu_profile_walk.profiler_tables(tp.key_averages(), "cpu", 5)
    assert len(cpu) == 1 and cpu[0].startswith("## sorted by self_cpu_time_total\n")


def test_profile_walk_arguments_are_refused_before_any_model_is_built(fake_cuda, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "build_pair", lambda *a, **k: pytest.fail("built a pair for bad arguments"))
    assert gpu_profile_walk.main(["--device", "cuda:3", "--out", str(tmp_path / "a")]) == 2
    assert "cuda:3" in capsys.readouterr().err and not (tmp_path / "a").exists()
    afile = tmp_path / "afile"
    afile.write_text("")
    assert gpu_profile_walk.main(["--tiny", "--out", str(afile / "sub")]) == 2
    assert "--out" in capsys.readouterr().err
    for bad in (["--prompts", "0"], ["--positions", "0"], ["--lines", "-1"], ["--shape", "nope"]):
        with pytest.raises(SystemExit) as exc:
            gpu_profile_walk.main(["--tiny", "--out", str(tmp_path / "b"), *bad])
        assert exc.value.code == 2, bad


@pytest.mark.slow
def test_profile_walk_writes_its_tables_under_out_and_a_failed_part_keeps_the_others(monkeypatch, tmp_path, capsys):
    out = tmp_path / "new" / "folder"
    real = gpu_profile_walk._torch_tables

    def chains_broken(label, *a):
        if label == "chains":
            raise RuntimeError("torch.profiler broke on chains")
        return real(label, *a)

    monkeypatch.setattr(gpu_profile_walk, "_torch_tables", chains_broken)
    assert gpu_profile_walk.main(["--tiny", "--prompts", "1", "--positions", "2", "--lines", "5",
                                  "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# part 'chains: torch.profiler' failed" in text and "torch.profiler broke on chains" in text
    assert sorted(p.name for p in out.iterdir()) == ["cprof_chains.txt", "cprof_trees.txt", "torchprof_trees.txt"]
    head = (out / "cprof_trees.txt").read_text().splitlines()[0]
    assert head.startswith("# trees: walk ") and "other / forward" in head
    ratio = float(head.split("other / forward ")[1].split(")")[0])
    assert math.isfinite(ratio) and ratio >= 0
    assert "## sorted by self_cpu_time_total" in (out / "torchprof_trees.txt").read_text()
    assert np.isfinite(float(head.split("walk ")[1].split(" s")[0]))


# --------------------------------------------------------------------------- otspec/profile/_distributed.py
def test_dask_workers_see_the_cuda_devices(fake_cuda):
    from otspec.profile import _distributed

    fake_cuda.n = 2
    assert _distributed._gpus_seen() == 2 and _distributed._own_device() == "cuda:0"
    fake_cuda.n = 0
    assert _distributed._gpus_seen() == 0 and _distributed._own_device() == "cpu"


def test_gpu_check_positions_reach_the_profile_overhead_part(monkeypatch, capsys):
    """``--positions`` sets the profile-overhead walk's positions per prompt (a longer walk amortises the per-run
    calibration); below 1 it is refused before any pair is built."""
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--tiny", "--positions", "0"])
    assert exc.value.code == 2 and "--positions" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(gpu_check, "_forward_rows", lambda *a, **k: None)
    monkeypatch.setattr(gpu_check, "_profile_overhead", lambda d, t, prompts, positions, keep: seen.append(positions))
    assert gpu_check.main(["--tiny", "--profile-only", "--positions", "7"]) == 0
    assert gpu_check.main(["--tiny", "--profile-only"]) == 0
    assert seen == [7, gpu_check.PLANS["tiny"]["positions"]]
