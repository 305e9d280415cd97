"""numba's compilations in a test run, this checkout against another: CPU seconds cold and warm, side by side.

Each checkout in turn: every ``.nbi``/``.nbc`` cache file below it removed, the test files run in one process
(``pytest -n 0``) twice, caches cold then warm, under ``/usr/bin/time``; the compiled signatures of otspec's kernels
counted from the cache index files the cold run wrote. Prints the load average before and after, a row per
checkout and the ratios (this checkout / the other)::

    python experiments/bench_test_compile.py --against /path/to/clone-of-start-commit [test files...]
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
from pathlib import Path

FILES = ["tests/test_tree_bound.py", "tests/test_tree_bound_checked_cd.py", "tests/test_alpha_k_device_ops.py",
         "tests/test_validation.py", "tests/test_tree_decoding_lazy.py"]


def signatures(root: Path) -> tuple[int, int]:
    """(kernels, signatures) in the numba cache index files below ``root/otspec``."""
    kernels = sigs = 0
    for f in (root / "otspec").rglob("*.nbi"):
        with open(f, "rb") as fh:
            pickle.load(fh)                                  # numba's version
            _, overloads = pickle.loads(fh.read())
        kernels += 1
        sigs += len(overloads)
    return kernels, sigs


def run(root: Path, files) -> tuple[float, float]:
    """CPU seconds (user + sys) and wall seconds of one ``pytest -n 0`` run of ``files`` in ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S", sys.executable, "-m", "pytest", "-q", "-n", "0",
                          "-p", "no:cacheprovider", *files], cwd=root, env=env, capture_output=True, text=True)
    line = [x for x in out.stderr.splitlines() if x.startswith("TIME ")][-1].split()
    if out.returncode != 0:
        print(out.stdout[-2000:], file=sys.stderr)
    return float(line[2]) + float(line[3]), float(line[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, type=Path, help="the other checkout (e.g. a clone of the start)")
    ap.add_argument("files", nargs="*", default=FILES)
    a = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    print("load average:", open("/proc/loadavg").read().split()[:3])
    rows = {}
    for name, root in (("this", here), ("other", a.against.resolve())):
        for f in root.rglob("*.nb[ic]"):
            f.unlink()
        cold = run(root, a.files)
        k, s = signatures(root)
        warm = run(root, a.files)
        rows[name] = (cold, warm, k, s)
        print(f"{name:6s} cold {cold[0]:7.1f} CPU-s {cold[1]:7.1f} s wall   warm {warm[0]:6.1f} CPU-s {warm[1]:6.1f} s"
              f" wall   {s} signatures of {k} kernels")
    t, o = rows["this"], rows["other"]
    print(f"ratio  cold CPU {t[0][0] / o[0][0]:.3f}   warm CPU {t[1][0] / o[1][0]:.3f}   signatures {t[3] / max(o[3], 1):.3f}")
    print("load average:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
