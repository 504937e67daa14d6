"""CXR-Phantom generation speed and memory (not a timed test; prints JSON lines).

    python bench/bench_phantom.py                      # 400 studies at 256 px, 1 and 2 workers
    python bench/bench_phantom.py --n 2000 --size 512
    python bench/bench_phantom.py --large 100000 --out /data/phantom100k   # the streamed 100k run, peak RSS

Each line: {"bench": "phantom", "metric": ..., "value": ..., "unit": ..., "vs": ...}. Throughput is
reported twice: wall clock (what you get on this machine now, shared or not) and per CPU-second of the
parent and its workers (what 2 free cores would give); the machine's load average is in "vs".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medclr.phantom import generate, load_material  # noqa: E402


def emit(metric: str, value: float, unit: str, vs=None) -> None:
    print(json.dumps({"bench": "phantom", "metric": metric, "value": round(float(value), 4), "unit": unit, "vs": vs}),
          flush=True)


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run_once(out: Path, n: int, size: int, workers: int, source: str, progress: bool = False) -> dict:
    cpu0, t0 = _cpu(), time.perf_counter()
    generate(out, n, seed=0, source=source, size=size, workers=workers, progress=progress)
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    return {"wall": wall, "cpu": cpu, "rate": n / wall, "cpu_rate": n / cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--source", default="both")
    ap.add_argument("--large", type=int, default=0, help="one streamed run of this many studies (2 workers)")
    ap.add_argument("--out", type=Path, default=None, help="folder for --large (kept)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_material()  # the one-off cache build is not part of the timing
    load = os.getloadavg()[0]
    if args.large:
        out = args.out or Path(tempfile.mkdtemp(prefix="phantom-large-"))
        r = run_once(out, args.large, args.size, 2, args.source, progress=True)
        self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        ctx = f"n={args.large}, {args.size}px, 2 workers, load avg {load:.1f} at start"
        emit("large_run_wall_studies_per_s", r["rate"], "studies/s", ctx)
        emit("large_run_cpu_studies_per_s_on_2_cores", 2 * r["cpu_rate"], "studies/s", ctx)
        emit("large_run_peak_rss_parent", self_rss, "MiB", ctx)
        emit("large_run_peak_rss_worker", child_rss, "MiB", ctx)
        emit("large_run_wall_time", r["wall"], "s", ctx)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="phantom-bench-"))
    try:
        one = run_once(tmp / "w1", args.n, args.size, 1, args.source)
        two = run_once(tmp / "w2", args.n, args.size, 2, args.source)
        ctx = f"n={args.n}, {args.size}px, source={args.source}, load avg {load:.1f} (2-core machine)"
        emit(f"studies_per_s_{args.size}px_2_workers_wall", two["rate"], "studies/s",
             f"1 worker {one['rate']:.1f}/s (x{two['rate'] / one['rate']:.2f}); target 40; {ctx}")
        emit(f"studies_per_s_{args.size}px_2_cores_cpu", 2 * two["cpu_rate"], "studies/s",
             f"= 2 / (CPU-seconds per study, parent + workers); target 40; {ctx}")
        emit(f"cpu_ms_per_study_{args.size}px", 1000 / two["cpu_rate"], "ms", ctx)
        emit("peak_rss_worker", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "MiB", ctx)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
