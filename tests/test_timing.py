"""One way to time a device call: synchronised before the clock starts and after it stops, warmed up, interleaved
rounds, medians and spread -- checked with stand-in devices (no GPU): one that counts its synchronisations, one
that queues work and runs it only when asked to synchronise (as an accelerator does)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from otspec._timing import Stopwatch, Timing, synchronize, timed, timed_rounds


class CountingDevice:
    """Counts synchronisations; records the order of events."""

    def __init__(self):
        self.syncs = 0
        self.events = []

    def synchronize(self):
        self.syncs += 1
        self.events.append("sync")


class QueueDevice:
    """An asynchronous device: a launch returns at once, its work (seconds of sleep) runs when synchronised."""

    def __init__(self):
        self.queued = 0.0

    def launch(self, seconds: float):
        self.queued += seconds

    def synchronize(self):
        if self.queued:
            time.sleep(self.queued)
        self.queued = 0.0


def test_every_timed_call_is_synchronised_before_and_after():
    dev = CountingDevice()
    got = timed(lambda: dev.events.append("call"), device=dev, warmup=2, repeats=3)
    assert dev.syncs == 2 * 5 and len(got.samples) == 3
    assert dev.events == ["sync", "call", "sync"] * 5


def test_rounds_interleave_and_rotate_and_reset_outside_the_clock():
    dev = CountingDevice()
    calls = {key: (lambda key=key: dev.events.append(key)) for key in "abc"}
    got = timed_rounds(calls, device=dev, warmup=1, repeats=2, reset=lambda key: dev.events.append(f"reset {key}"))
    order = [e for e in dev.events if e in "abc"]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # every call once per round, rotated
    assert list(got) == ["a", "b", "c"] and all(len(t.samples) == 2 for t in got.values())
    # each call: sync, call, sync, then its reset (untimed)
    i = dev.events.index("b")
    assert dev.events[i - 1:i + 3] == ["sync", "b", "sync", "reset b"]


def test_queued_work_is_charged_to_the_call_that_queued_it():
    dev = QueueDevice()
    # "slow" launches 30 ms of work and returns at once; "fast" launches none. The reset after "slow" queues
    # 30 ms more (a cache cut): charged to no call. Without synchronising, "fast" would pay for both.
    got = timed_rounds({"slow": lambda: dev.launch(0.03), "fast": lambda: None}, device=dev, warmup=0, repeats=3,
                       reset=lambda key: dev.launch(0.03) if key == "slow" else None)
    assert min(got["slow"].samples) >= 0.03
    assert max(got["fast"].samples) < 0.015
    sw = Stopwatch(dev)
    dev.launch(0.03)  # queued before the section: not its work
    with sw:
        pass
    assert sw.seconds < 0.015 and sw.count == 1
    with sw:
        dev.launch(0.02)
    assert sw.laps[-1] >= 0.02 and sw.count == 2
    assert len(sw.starts) == 2 and sw.starts[1] - sw.starts[0] >= sw.laps[0]  # each section's start, in order


def test_timing_statistics():
    t = Timing.of([3.0, 1.0, 2.0, 10.0])
    assert (t.median, t.spread, t.samples) == (2.5, 4.5, (3.0, 1.0, 2.0, 10.0))
    assert Timing.of([1.5]).spread == 0.0
    with pytest.raises(ValueError, match="`samples` must hold at least one time"):
        Timing.of([])


def test_bad_counts_and_empty_calls_are_refused():
    with pytest.raises(ValueError, match="`repeats` must be an integer >= 1, got 0"):
        timed(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="`warmup` must be an integer >= 0, got -1"):
        timed(lambda: None, warmup=-1)
    with pytest.raises(ValueError, match="`warmup` must be an integer >= 0, got True"):
        timed(lambda: None, warmup=True)
    with pytest.raises(ValueError, match="`calls` must hold at least one call"):
        timed_rounds({})


def test_cpu_and_none_need_no_synchronisation():
    synchronize(None)
    synchronize("cpu")
    torch = pytest.importorskip("torch")
    synchronize(torch.device("cpu"))
    assert timed(lambda: np.zeros(10), device=torch.device("cpu"), warmup=0, repeats=1).median >= 0.0


def test_the_cost_calibration_synchronises_every_call_on_the_models_device(monkeypatch):
    pytest.importorskip("torch")
    import otspec._timing as timing
    from otspec.profile import ProfileSettings, toy_pair
    from otspec.profile._collect import COST_REPEATS, COST_WARMUP, cost_rows, cost_shapes

    d, t = toy_pair(5, seed=0)
    seen = []
    monkeypatch.setattr(timing, "synchronize", lambda device=None: seen.append(str(device)))
    s = ProfileSettings(k_max=2, L_max=2, families=["token"], verifiers=["token"])
    cols = cost_rows(d, t, [0, 1, 2], s, 0, overhead=False)
    shapes = cost_shapes(s)
    rounds = COST_WARMUP + COST_REPEATS
    assert seen == ["cpu"] * 2 * rounds * (len(shapes["target"]) + len(shapes["draft"]))
    calls = [n for n in cols["name"] if n in ("target", "draft")]
    assert len(calls) == COST_REPEATS * (len(shapes["target"]) + len(shapes["draft"]))
    # beside them, the calibration's own record: its budget and the seconds it took
    assert sorted(n for n in cols["name"] if n not in ("target", "draft")) == ["calibration:budget",
                                                                                "calibration:seconds"]
