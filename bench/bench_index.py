"""Index benchmark: single-query p50/p99 latency and recall@10 against exact search, at 1e5 and 1e6 vectors.

Data: synthetic clustered unit vectors in the joint dim (d = 128, 1000 Gaussian clusters with a
within-cluster spread large enough that neighbours are not trivially separated), 1000 held-out queries
from the same distribution. Ground truth = exact inner-product search (IndexFlatIP, batched). Every
index is built and searched through ``medclr.index.VectorIndex``, the code the app uses, one query at a
time (as a clinician's request arrives).

    OMP_NUM_THREADS=1 python bench/bench_index.py --sizes 100000           # ~1 min
    OMP_NUM_THREADS=2 python bench/bench_index.py --sizes 100000 1000000   # the 1e6 run (HNSW build minutes)

Prints one JSON line per figure: {"bench", "metric", "value", "unit", "vs"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the medclr CLI does (docs/app.md)

from medclr.index.vectors import VectorIndex, choose_kind, normalized  # noqa: E402


def emit(metric: str, value, unit: str, vs=None, **extra) -> None:
    print(json.dumps({"bench": "index", "metric": metric, "value": value, "unit": unit, "vs": vs, **extra}), flush=True)


def make_data(n: int, nq: int, d: int, seed: int = 0, clusters: int = 1000, spread: float = 1.5):
    rng = np.random.default_rng(seed)
    centres = normalized(rng.standard_normal((clusters, d)).astype(np.float32))
    out = np.empty((n + nq, d), np.float32)
    for start in range(0, n + nq, 200_000):
        m = min(200_000, n + nq - start)
        lab = rng.integers(0, clusters, m)
        # noise of norm ~spread around unit centres
        out[start:start + m] = centres[lab] + spread * rng.standard_normal((m, d)).astype(np.float32) / np.sqrt(d)
    out = normalized(out)
    return out[:n], out[n:]


def exact_topk(xb: np.ndarray, xq: np.ndarray, k: int) -> np.ndarray:
    import faiss

    flat = faiss.IndexFlatIP(xb.shape[1])
    flat.add(xb)
    return flat.search(xq, k)[1]


def measure(vi: VectorIndex, xq: np.ndarray, truth: np.ndarray, k: int = 10, n_lat: int | None = None) -> dict:
    vi.search(xq[:20], k)  # warm-up
    lat, got = [], []
    for q in xq[:n_lat]:
        t = time.perf_counter()
        _, ids = vi.search(q[None], k)
        lat.append((time.perf_counter() - t) * 1e3)
        got.append(ids[0])
    recall = float(np.mean([len(set(g) & set(t)) / k for g, t in zip(got, truth[:len(got)])]))
    return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)), "recall": recall}


def _set_param(vi: VectorIndex, name: str, value: int) -> None:
    import faiss

    inner = faiss.downcast_index(vi.cpu.index) if hasattr(vi.cpu, "index") else vi.cpu
    if name == "efSearch":
        inner.hnsw.efSearch = value
    else:
        faiss.extract_index_ivf(vi.cpu).nprobe = value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--kinds", nargs="+", default=["flat", "hnsw", "ivf"])
    ap.add_argument("--spread", type=float, default=1.5, help="within-cluster noise norm (centres have norm 1); "
                    "1.5 makes IVF's recall drop below 1, a harder case than tight clusters")
    ap.add_argument("--ef", type=int, nargs="*", default=[64, 256], help="extra HNSW efSearch values to sweep")
    ap.add_argument("--nprobe", type=int, nargs="*", default=[64], help="extra IVF nprobe values to sweep")
    args = ap.parse_args()
    import faiss

    emit("faiss_threads", faiss.omp_get_max_threads(), "threads")
    for n in args.sizes:
        xb, xq = make_data(n, args.queries, args.dim, spread=args.spread)
        truth = exact_topk(xb, xq, 10)
        ids = np.arange(n, dtype=np.int64)
        results = {}
        for kind in args.kinds:
            t = time.perf_counter()
            vi = VectorIndex.create(args.dim, kind, train=xb, use_gpu=False)
            vi.add(xb, ids)
            build = time.perf_counter() - t
            # exact search needs no recall estimate: time it on fewer queries at large n
            r = measure(vi, xq, truth, n_lat=200 if (kind == "flat" and n > 200_000) else None)
            results[kind] = r
            tag = {"n": n, "dim": args.dim, "kind": kind, "spread": args.spread}
            emit("build_time", round(build, 2), "s", **tag)
            emit("p50_latency", round(r["p50"], 4), "ms", vs="exact" if kind != "flat" else None, **tag)
            emit("p99_latency", round(r["p99"], 4), "ms", **tag)
            emit("recall@10", round(r["recall"], 4), "fraction", vs="exact IndexFlatIP", **tag)
            sweeps = [("efSearch", v) for v in args.ef] if kind == "hnsw" else \
                [("nprobe", v) for v in args.nprobe] if kind == "ivf" else []
            for name, value in sweeps:
                _set_param(vi, name, value)
                s = measure(vi, xq, truth)
                emit("p50_latency", round(s["p50"], 4), "ms", vs="exact", **tag, **{name: value})
                emit("recall@10", round(s["recall"], 4), "fraction", vs="exact IndexFlatIP", **tag, **{name: value})
            del vi
        for kind, r in results.items():
            if kind != "flat" and "flat" in results:
                emit("speedup_p50", round(results["flat"]["p50"] / r["p50"], 2), "x", vs="flat", n=n, kind=kind)
        auto = choose_kind(n)
        if auto in results:
            emit("auto_choice_p50", round(results[auto]["p50"], 4), "ms", vs="goal 1 ms at 1e6", n=n, kind=auto)
            emit("auto_choice_recall@10", round(results[auto]["recall"], 4), "fraction", vs="goal 0.95 at 1e6",
                 n=n, kind=auto)


if __name__ == "__main__":
    main()
