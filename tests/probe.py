"""Size-guard probes in one child process whose address space is capped (shared by the guard tests).

Each probe is a line of code evaluated in the child after ``setup``. The child caps its own address space
(``resource.setrlimit(RLIMIT_AS)``) at what the interpreter holds after ``setup`` plus ``headroom`` bytes, so a
guard that let its request through dies with MemoryError instead of raising the ValueError that names the
parameter and the limit; each probe also runs under a SIGALRM of ``alarm`` seconds, so a hang (an O(size) loop,
a bignum) is one failed row, not a stuck suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

#: Bytes the child may allocate above what it holds after its setup.
HEADROOM = 256 * 2**20

_CHILD = textwrap.dedent(
    """
    import json, resource, signal, time
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * resource.getpagesize()
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (used + HEADROOM, limits[1]))

    class Hang(BaseException):
        pass

    def on_alarm(*_):
        raise Hang()

    signal.signal(signal.SIGALRM, on_alarm)
    out = []
    for name, code in PROBES:
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, ALARM)
        try:
            eval(code)
            out.append((name, "accepted", "", time.perf_counter() - t0))
        except (ValueError, TypeError) as exc:
            out.append((name, "refused", str(exc), time.perf_counter() - t0))
        except MemoryError as exc:
            out.append((name, "MemoryError", str(exc), time.perf_counter() - t0))
        except Hang:
            out.append((name, "hang", "", time.perf_counter() - t0))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        AFTER_EACH()
    resource.setrlimit(resource.RLIMIT_AS, limits)  # the report itself is not capped
    print(json.dumps(out))
    """
)


def run_probes(probes, setup: str, *, headroom: int = HEADROOM, alarm: float = 10.0,
               timeout: float = 300.0) -> dict[str, tuple[str, str, float]]:
    """Run ``probes`` (``(name, code, ...)`` rows) in one capped child; ``{name: (status, message, seconds)}``.

    ``setup`` is Python run first in the child (imports, warm-up calls, the names the probes use); it may define
    ``AFTER_EACH()`` (run after every probe, e.g. to close figures). ``status`` is ``"refused"`` (ValueError or
    TypeError), ``"accepted"``, ``"MemoryError"`` or ``"hang"`` (past ``alarm`` seconds).
    """
    code = (f"HEADROOM = {int(headroom)}\nALARM = {float(alarm)!r}\nPROBES = {[(p[0], p[1]) for p in probes]!r}\n"
            "def AFTER_EACH():\n    pass\n" + textwrap.dedent(setup) + _CHILD)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: (status, msg, secs) for name, status, msg, secs in rows}
