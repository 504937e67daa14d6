"""Index benchmark: single-query p50/p95/p99 latency, batched search and recall@10 against exact search, at 1e5 and 1e6 vectors.

Data: synthetic clustered unit vectors in the joint dim (d = 128, 1000 Gaussian clusters with a
within-cluster spread large enough that neighbours are not trivially separated), 1000 held-out queries
from the same distribution. Ground truth = exact inner-product search (IndexFlatIP, batched). Every
index is built and searched through ``medclr.index.VectorIndex``, the code the app uses, one query at a
time (as a clinician's request arrives), then all queries in one call (``batch_search``: ms per call and
queries/s, as a batch job would). ``--gpu yes`` searches on GPU 0 (faiss's GPU build: ``pip install
'medclr[gpu]'``; flat and IVF, HNSW stays on the CPU): its recall@10 against the exact CPU search is the
check that GPU and CPU agree. ``--kinds auto`` is the kind ``medclr index build`` picks at each size.
The process's peak resident memory is reported after each size.

    OMP_NUM_THREADS=1 python bench/bench_index.py --sizes 100000           # ~1 min
    OMP_NUM_THREADS=2 python bench/bench_index.py --sizes 100000 1000000   # the 1e6 run (HNSW build minutes)
    python bench/bench_index.py --sizes 1000000 --kinds flat ivf --gpu yes  # on a GPU machine
    OMP_NUM_THREADS=1 python bench/bench_index.py --rerank 5000            # LSE+NL re-ranking of text queries

``--rerank N``: text -> image search through ``RetrievalIndex.search_images_by_text`` (faiss's top
max(10 k, 100) by global cosine re-ranked by an LSE+NL head on float16 cells, 8 x 8 x 128 per image,
memory-mapped) against plain ``search_images`` at k = 8, the full head scan it replaces, the cells
file's size, and how many of the full scan's top k the pool keeps (synthetic cells: images drawn
around 200 cluster centres, cells = centre + per-cell noise, global = their normalised mean; the
recall on a trained model's cells is not this number).

Prints one JSON line per figure: {"bench", "metric", "value", "unit", "vs"}.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    return {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
            "p99": float(np.percentile(lat, 99)), "recall": recall}


def batch_search(vi: VectorIndex, xq: np.ndarray, truth: np.ndarray, k: int = 10, reps: int = 3) -> dict:
    """All queries in one call (best of ``reps``): ms per call, queries/s, recall@k of the batched answer."""
    best, ids = np.inf, None
    for _ in range(reps):
        t = time.perf_counter()
        _, ids = vi.search(xq, k)
        best = min(best, time.perf_counter() - t)
    recall = float(np.mean([len(set(g) & set(t)) / k for g, t in zip(ids, truth)]))
    return {"ms": best * 1e3, "qps": len(xq) / best, "recall": recall}


def _set_param(vi: VectorIndex, name: str, value: int) -> None:
    import faiss

    inner = faiss.downcast_index(vi.cpu.index) if hasattr(vi.cpu, "index") else vi.cpu
    if name == "efSearch":
        inner.hnsw.efSearch = value
    else:
        faiss.extract_index_ivf(vi.cpu).nprobe = value


def rerank_bench(n: int, k: int, queries: int, pools: list[int], gamma: float, seed: int = 0) -> None:
    import tempfile

    import pandas as pd
    import torch

    from medclr.index.store import RetrievalIndex, rerank_pool
    from medclr.models.similarity import LSENLHead

    torch.set_num_threads(1)
    d, cells_per_image, clusters = 128, 64, 200
    rng = np.random.default_rng(seed)
    centres = normalized(rng.standard_normal((clusters, d)).astype(np.float32))
    tmp = Path(tempfile.mkdtemp(prefix="bench_rerank_"))
    path = tmp / "image_cells.npy"
    cells = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, cells_per_image, d))
    glob = np.empty((n, d), np.float32)
    for start in range(0, n, 1000):
        m = min(1000, n - start)
        c = centres[rng.integers(0, clusters, m)][:, None, :] + \
            1.5 * rng.standard_normal((m, cells_per_image, d)).astype(np.float32) / np.sqrt(d)
        c /= np.linalg.norm(c, axis=-1, keepdims=True)
        cells[start:start + m] = c.astype(np.float16)
        glob[start:start + m] = c.mean(1)
        if start == 0:
            exact_first = c  # float32 cells of the first images: the float16 storage's score error
    cells.flush()
    del cells
    ids = np.arange(n, dtype=np.int64)
    vi = VectorIndex.create(d, "flat", use_gpu=False)
    vi.add(glob, ids)
    table = pd.DataFrame({"id": ids, "manifest_index": ids, "image_path": "", "report": ""}).set_index("id", drop=False)
    head = LSENLHead(d, gamma=gamma, trained=True).eval()
    idx = RetrievalIndex(tmp, {}, vi, None, table, None, None, head=head, cells=np.load(path, mmap_mode="r"),
                         cell_ids=pd.Index(ids), device=torch.device("cpu"))
    # a text query: one cell of a random image, plus noise
    src = rng.integers(0, n, queries)
    q = np.asarray(idx.cells[src, rng.integers(0, cells_per_image, queries)], np.float32)
    q = normalized(q + 0.5 * rng.standard_normal(q.shape).astype(np.float32) / np.sqrt(d))
    size = path.stat().st_size
    tag = {"n": n, "k": k, "dim": d, "cells_per_image": cells_per_image, "gamma": gamma}
    with torch.inference_mode():
        qt = torch.from_numpy(q)
        err = (head.score(torch.from_numpy(np.asarray(idx.cells[:len(exact_first)])).float(), qt)
               - head.score(torch.from_numpy(exact_first), qt)).abs()
    emit("float16_score_error_max", float(f"{err.max().item():.3g}"), "score", vs="float32 cells", **tag)
    emit("float16_score_error_mean", float(f"{err.mean().item():.3g}"), "score", vs="float32 cells", **tag)
    emit("cells_file_size", round(size / 2**20, 2), "MiB", **tag)
    emit("cells_bytes_per_image", cells_per_image * d * 2, "B", **tag)

    def timed(fn) -> tuple[float, float, list]:
        for x in q[:10]:
            fn(x[None])  # warm-up
        lat, got = [], []
        for x in q:
            t = time.perf_counter()
            got.append([h["id"] for h in fn(x[None])[0]])
            lat.append((time.perf_counter() - t) * 1e3)
        return float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), got

    p50, p99, _ = timed(lambda x: idx.search_images(x, k))
    emit("p50_latency", round(p50, 3), "ms", mode="faiss global cosine", **tag)
    emit("p99_latency", round(p99, 3), "ms", mode="faiss global cosine", **tag)
    all_cells = torch.from_numpy(np.asarray(idx.cells, np.float32))

    def full_scan(x):
        with torch.inference_mode():
            s = head.score(all_cells, torch.from_numpy(x))[:, 0].numpy()
        return [[{"id": int(i)} for i in np.argsort(-s, kind="stable")[:k]]]

    p50, p99, truth = timed(full_scan)
    emit("p50_latency", round(p50, 3), "ms", mode="head.score over all images (cells in RAM, float32)", **tag)
    emit("p99_latency", round(p99, 3), "ms", mode="head.score over all images (cells in RAM, float32)", **tag)
    for pool in [None, *pools]:
        p50, p99, got = timed(lambda x, pool=pool: idx.search_images_by_text(x, k, pool=pool))
        recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(got, truth)]))
        mode = {"mode": "re-ranked", "pool": rerank_pool(k, n, pool), "default_pool": pool is None}
        emit("p50_latency", round(p50, 3), "ms", **mode, **tag)
        emit("p99_latency", round(p99, 3), "ms", **mode, **tag)
        emit("recall@k_vs_full_head_scan", round(recall, 4), "fraction", **mode, **tag)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--kinds", nargs="+", default=["flat", "hnsw", "ivf"],
                    help="flat, hnsw, ivf, or auto (the kind medclr index build picks at that size)")
    ap.add_argument("--gpu", choices=("no", "auto", "yes"), default="no",
                    help="search on GPU 0 (faiss GPU build; flat and ivf): yes fails clearly without one")
    ap.add_argument("--spread", type=float, default=1.5, help="within-cluster noise norm (centres have norm 1); "
                    "1.5 makes IVF's recall drop below 1, a harder case than tight clusters")
    ap.add_argument("--ef", type=int, nargs="*", default=[64, 256], help="extra HNSW efSearch values to sweep")
    ap.add_argument("--nprobe", type=int, nargs="*", default=[64], help="extra IVF nprobe values to sweep")
    ap.add_argument("--rerank", type=int, default=None, metavar="N",
                    help="instead: LSE+NL re-ranking of text queries over N synthetic images (e.g. 5000)")
    ap.add_argument("--rerank-k", type=int, default=8)
    ap.add_argument("--rerank-pools", type=int, nargs="*", default=[400, 1000])
    ap.add_argument("--rerank-gamma", type=float, default=20.0)
    args = ap.parse_args()
    import faiss

    emit("faiss_threads", faiss.omp_get_max_threads(), "threads")
    if args.rerank:
        rerank_bench(args.rerank, args.rerank_k, min(args.queries, 300), args.rerank_pools, args.rerank_gamma)
        return
    for n in args.sizes:
        xb, xq = make_data(n, args.queries, args.dim, spread=args.spread)
        truth = exact_topk(xb, xq, 10)
        ids = np.arange(n, dtype=np.int64)
        results = {}
        for kind in dict.fromkeys(choose_kind(n) if k == "auto" else k for k in args.kinds):
            t = time.perf_counter()
            vi = VectorIndex.create(args.dim, kind, train=xb, use_gpu=False)
            vi.add(xb, ids)
            vi.set_gpu({"no": False, "yes": True}.get(args.gpu, "auto"))
            build = time.perf_counter() - t
            # exact search needs no recall estimate: time it on fewer queries at large n
            r = measure(vi, xq, truth, n_lat=200 if (kind == "flat" and n > 200_000) else None)
            results[kind] = r
            tag = {"n": n, "dim": args.dim, "kind": kind, "spread": args.spread, "on_gpu": vi.on_gpu,
                   "auto_kind": choose_kind(n) == kind}
            emit("build_time", round(build, 2), "s", **tag)
            emit("p50_latency", round(r["p50"], 4), "ms", vs="exact" if kind != "flat" else None, **tag)
            emit("p95_latency", round(r["p95"], 4), "ms", **tag)
            emit("p99_latency", round(r["p99"], 4), "ms", **tag)
            emit("recall@10", round(r["recall"], 4), "fraction", vs="exact IndexFlatIP (CPU)", **tag)
            b = batch_search(vi, xq, truth)
            emit("batch_search", round(b["ms"], 2), "ms", queries=len(xq), **tag)
            emit("batch_queries_per_s", round(b["qps"], 1), "queries/s", queries=len(xq), **tag)
            emit("batch_recall@10", round(b["recall"], 4), "fraction", vs="exact IndexFlatIP (CPU)", **tag)
            sweeps = [("efSearch", v) for v in args.ef] if kind == "hnsw" else \
                [("nprobe", v) for v in args.nprobe] if kind == "ivf" else []
            for name, value in sweeps:
                _set_param(vi, name, value)
                s = measure(vi, xq, truth)
                emit("p50_latency", round(s["p50"], 4), "ms", vs="exact", **tag, **{name: value})
                emit("recall@10", round(s["recall"], 4), "fraction", vs="exact IndexFlatIP", **tag, **{name: value})
            del vi
        emit("peak_rss", round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2), "GiB", n=n)
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
