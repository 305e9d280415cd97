r"""One way to time work on a device: synchronised before the clock starts and after it stops, warmed up, medians.

An accelerator runs kernels asynchronously: a clock read when a call returns
measures its launch, and work still queued from an earlier call lands on the
next call that waits for the device. Every timer of the package -- the
profile's cost calibration and its timers, the decoder's timers, the
benchmarks under ``experiments/`` -- goes through this module:

* :func:`synchronize` waits for a device (CUDA, MPS, XPU; a no-op on the CPU;
  any object with a ``synchronize()`` method, e.g. a stand-in in tests);
* :func:`timed` times one call: warm-up calls first, then repetitions, each
  with the device synchronised before the clock starts and after it stops;
* :func:`timed_rounds` times several calls in interleaved rounds (every call
  once per round, the order rotated from round to round, so that a drift of
  the machine's load falls on all of them alike), with an optional ``reset``
  between calls that runs outside the clock;
* :class:`Stopwatch` accumulates synchronised sections (``with sw: ...``).

Each result is a :class:`Timing`: the median of the repetitions, their spread
(half their range) and the samples, so that a comparison of two timings can
be made beyond their spread and a bootstrap can resample the repetitions.

This is how engines and their benchmarks time a step: synchronise, warm up,
repeat and keep a robust statistic (vLLM's ``benchmarks/``, SGLang's
``bench_speculative.py``; PyTorch's ``torch.utils.benchmark.Timer``, which
synchronises CUDA around each measurement and reports medians).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Mapping

import numpy as np

__all__ = ["Timing", "Stopwatch", "synchronize", "timed", "timed_rounds", "clock", "now"]

_CLOCK = [time.perf_counter]


def now() -> float:
    """The clock every timer of the package reads: :func:`time.perf_counter` (wall seconds), unless :func:`clock`
    chose another for a block of code."""
    return _CLOCK[0]()


@contextmanager
def clock(fn: Callable[[], float]) -> Iterator[None]:
    """Read ``fn`` instead of :func:`time.perf_counter` in every timer of the package inside the block.

    :func:`time.process_time` (the process's CPU seconds) measures the work of a single-threaded CPU run
    without the waits that other processes' load adds at random: on an idle core with one torch thread the
    two clocks agree; on a shared, loaded machine CPU seconds compare two runs more stably. Never for an
    accelerator (the host waits on it without using CPU time).

    Examples
    --------
    >>> import time
    >>> with clock(time.process_time):
    ...     t = timed(lambda: sum(range(1000)), warmup=0, repeats=2)
    >>> len(t.samples)
    2
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be a callable returning seconds, got {type(fn).__name__}")
    old = _CLOCK[0]
    _CLOCK[0] = fn
    try:
        yield
    finally:
        _CLOCK[0] = old


@dataclass(frozen=True)
class Timing:
    r"""The seconds of a timed call: median, spread and samples.

    .. math::

        \text{median} = \operatorname{med}(t_1, \dots, t_n), \qquad
        \text{spread} = \tfrac12 \bigl(\max_i t_i - \min_i t_i\bigr).

    Attributes
    ----------
    median : float
        Median seconds of the repetitions.
    spread : float
        Half the range of the repetitions (0 for one repetition).
    samples : tuple of float
        Every repetition's seconds, in the order they were taken.
    """

    median: float
    spread: float
    samples: tuple

    @classmethod
    def of(cls, samples) -> Timing:
        """The :class:`Timing` of a sequence of seconds (at least one)."""
        s = tuple(float(x) for x in samples)
        if not s:
            raise ValueError("`samples` must hold at least one time, got none")
        return cls(float(np.median(s)), 0.5 * (max(s) - min(s)), s)


def _validate_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    return int(value)


def synchronize(device: Any = None) -> None:
    """Wait until every kernel queued on ``device`` has finished.

    Parameters
    ----------
    device : torch.device, str, object with ``synchronize()``, or None
        ``"cuda"`` / ``"cuda:i"``: :func:`torch.cuda.synchronize`; ``"mps"``: :func:`torch.mps.synchronize`;
        ``"xpu"``: :func:`torch.xpu.synchronize`; ``"cpu"`` or None: nothing to wait for. Any other object with
        a callable ``synchronize`` attribute is asked to wait (a stand-in device in tests).

    Examples
    --------
    >>> synchronize("cpu")  # nothing queued on a CPU: returns at once
    """
    if device is None:
        return
    sync = getattr(device, "synchronize", None)
    if callable(sync):
        sync()
        return
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cpu":
        return
    import torch

    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()
    elif kind == "xpu":  # pragma: no cover - no XPU here
        torch.xpu.synchronize(device)


class Stopwatch:
    """Seconds of synchronised sections, accumulated: ``with sw: work()`` adds the section's seconds.

    The device is synchronised when a section starts (work queued before it is not charged to it) and when
    it stops (the section's own kernels are). ``seconds`` is the sum, ``count`` the number of sections,
    ``laps`` every section's seconds and ``starts`` the clock (:func:`now`) at each section's start, after
    the synchronisation (the seconds from one section's start to the next's are the first section and every
    piece of work after it, timed or not).

    Examples
    --------
    >>> sw = Stopwatch("cpu")
    >>> with sw:
    ...     _ = sum(range(1000))
    >>> sw.count, sw.seconds >= 0.0
    (1, True)
    """

    def __init__(self, device: Any = None):
        self.device = device
        self.seconds = 0.0
        self.count = 0
        self.laps: list[float] = []
        self.starts: list[float] = []
        self._t0 = None

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._t0 = now()
        self.starts.append(self._t0)
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        dt = now() - self._t0
        self.seconds += dt
        self.count += 1
        self.laps.append(dt)


def timed(fn: Callable[[], Any], *, device: Any = None, warmup: int = 1, repeats: int = 5) -> Timing:
    r"""Seconds of ``fn()``: ``warmup`` untimed calls, then ``repeats`` calls each synchronised before and after.

    Parameters
    ----------
    fn : callable
        Called with no arguments.
    device : see :func:`synchronize`, keyword-only
    warmup : int, keyword-only
        Untimed calls first (kernels compiled, caches and allocators warm), at least 0.
    repeats : int, keyword-only
        Timed calls, at least 1.

    Returns
    -------
    Timing

    Raises
    ------
    ValueError
        ``warmup < 0`` or ``repeats < 1``.

    Examples
    --------
    >>> t = timed(lambda: sum(range(100)), warmup=1, repeats=3)
    >>> len(t.samples), t.median >= 0.0
    (3, True)
    """
    return timed_rounds({0: fn}, device=device, warmup=warmup, repeats=repeats)[0]


def timed_rounds(calls: Mapping[Hashable, Callable[[], Any]], *, device: Any = None, warmup: int = 1,
                 repeats: int = 5, reset: Callable[[Hashable], Any] | None = None) -> dict:
    r"""Seconds of several calls, timed in interleaved rounds.

    .. math::

        t_{c, r} = \text{seconds of call } c \text{ in round } r, \qquad
        r = 1, \dots, \text{warmup} + \text{repeats},

    every call once per round, the order of round ``r`` rotated by ``r`` (so that no call is always first
    after a reset, and a drift in the machine's load is shared); the first ``warmup`` rounds are not kept.
    Each call runs with the device synchronised before the clock starts and after it stops; ``reset(key)``
    runs after each call outside the clock (its queued work waits at the next call's synchronisation).

    Parameters
    ----------
    calls : mapping of key -> callable
        The calls, each taking no arguments.
    device : see :func:`synchronize`, keyword-only
    warmup, repeats : int, keyword-only
        As :func:`timed`.
    reset : callable or None, keyword-only
        Called with the key after every call of that key (e.g. cut a KV cache back), untimed.

    Returns
    -------
    dict
        ``key -> Timing``, in the order of ``calls``.

    Raises
    ------
    ValueError
        ``warmup < 0``, ``repeats < 1`` or no calls.

    Examples
    --------
    >>> got = timed_rounds({"a": lambda: None, "b": lambda: sum(range(100))}, warmup=0, repeats=2)
    >>> sorted(got), len(got["a"].samples)
    (['a', 'b'], 2)
    """
    warmup = _validate_count(warmup, "warmup", 0)
    repeats = _validate_count(repeats, "repeats", 1)
    keys = list(calls)
    if not keys:
        raise ValueError("`calls` must hold at least one call, got none")
    samples: dict = {key: [] for key in keys}
    for r in range(warmup + repeats):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            synchronize(device)
            t0 = now()
            calls[key]()
            synchronize(device)
            dt = now() - t0
            if r >= warmup:
                samples[key].append(dt)
            if reset is not None:
                reset(key)
    return {key: Timing.of(samples[key]) for key in keys}
