"""A faiss vector index for cosine search: normalised float32 vectors, inner-product metric, int64 ids.

Kinds (docs/index.md for the measurements behind the choices; bench/bench_index.py re-measures them):

* ``flat``: ``IndexIDMap2(IndexFlatIP)``, exact; supports add, remove and reconstruct. Default up to
  ``EXACT_MAX`` vectors.
* ``hnsw``: ``IndexIDMap(IndexHNSWFlat(d, 32, METRIC_INNER_PRODUCT))``, efConstruction 80, efSearch
  128; no training, incremental add. Default above ``EXACT_MAX``.
* ``ivf``: ``IndexIVFFlat`` (nlist ~ 4 sqrt(n), nprobe 16), trained on a sample; ids native.
  Centroids are never retrained on add: rebuild when the collection drifts.

GPU: when faiss's GPU build is importable and sees a GPU, flat and IVF indexes are cloned to GPU 0
for search (HNSW has no GPU version in non-cuVS builds and stays on the CPU). Files are always
written from the CPU copy.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path

import numpy as np

from medclr.errors import MedclrError

log = logging.getLogger(__name__)

KINDS = ("auto", "flat", "hnsw", "ivf")
EXACT_MAX = 100_000
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 80, 128
IVF_NPROBE = 16
# A single query gains nothing from OpenMP threads, and on a busy machine the idle thread's spin-wait
# costs more than the search (1e5 flat, 2 threads, loaded 2-core box: 80 ms p50 vs 11 ms on one).
SMALL_BATCH = 16


# The distributions that install the `faiss` package medclr imports: the cpu and gpu extras'. Both
# write the same files, so with both installed the one installed last is the one that loads.
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu")


def _faiss():
    # faiss's loader logs its SIMD probing at INFO ("Could not load library with AVX2 ..."): not news
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        import faiss
    except ImportError as exc:
        raise MedclrError(f"faiss cannot be imported ({exc}): pip install 'medclr[cpu]', or 'medclr[gpu]' on a "
                          "CUDA machine (the two provide the same `faiss` package: install one)") from None
    _say_which_faiss()
    return faiss


@functools.cache
def _say_which_faiss() -> None:
    """One log line per process: which faiss build loaded (``faiss_build_note``)."""
    import faiss

    level, line = faiss_build_note(faiss, installed_distributions(FAISS_DISTRIBUTIONS))
    log.log(level, "%s", line)


def installed_distributions(names) -> list[str]:
    """``name==version`` of each of ``names`` that is installed (one metadata look-up each)."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in names:
        try:
            found.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return found


def faiss_build_note(faiss, distributions: list[str]) -> tuple[int, str]:
    """(log level, the one line) saying which faiss build loaded: GPU or CPU, from the module itself, and from
    which of ``distributions`` (a warning when more than one is installed: they shadow each other)."""
    gpu = hasattr(faiss, "StandardGpuResources")
    build = f"faiss {getattr(faiss, '__version__', '?')}, {'GPU' if gpu else 'CPU'} build"
    if len(distributions) > 1:
        keep = "faiss-gpu" if gpu else "faiss-cpu"
        others = " ".join(d.split("==")[0] for d in distributions if not d.startswith(keep + "=="))
        return logging.WARNING, (f"{build} loaded, but {' and '.join(distributions)} are all installed and write the "
                                 f"same `faiss` package (the one installed last wins): keep one, e.g. `pip uninstall "
                                 f"{others}` then `pip install --force-reinstall --no-deps {keep}`")
    return logging.INFO, f"{build} loaded" + (f" (from {distributions[0]})" if distributions else "")


def choose_kind(n: int, kind: str = "auto", exact_max: int = EXACT_MAX) -> str:
    """``flat`` for small collections, ``hnsw`` for large ones, or the kind asked for."""
    if kind not in KINDS:
        raise MedclrError(f"index kind {kind!r}: expected one of {list(KINDS)}")
    if kind != "auto":
        return kind
    return "flat" if n <= exact_max else "hnsw"


def normalized(x: np.ndarray) -> np.ndarray:
    """C-contiguous float32 rows scaled to unit L2 norm (zero rows stay zero)."""
    x = np.array(x, dtype=np.float32, order="C", copy=True, ndmin=2)
    if x.ndim != 2:
        raise MedclrError(f"vectors: expected an N x D array, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    np.divide(x, norms, out=x, where=norms > 0)
    return x


def gpu_available() -> bool:
    faiss = _faiss()
    return hasattr(faiss, "StandardGpuResources") and getattr(faiss, "get_num_gpus", lambda: 0)() > 0


class VectorIndex:
    """Cosine search over int64-identified vectors (wraps one faiss index)."""

    def __init__(self, index, kind: str, use_gpu: bool | str = "auto") -> None:
        self.cpu, self.kind = index, kind
        self._gpu = None
        self._res = None
        self.set_gpu(use_gpu)

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def create(cls, dim: int, kind: str, train: np.ndarray | None = None, nlist: int | None = None,
               use_gpu: bool | str = "auto") -> VectorIndex:
        faiss = _faiss()
        if kind == "flat":
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        elif kind == "hnsw":
            hnsw = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            hnsw.hnsw.efSearch = HNSW_EF_SEARCH
            index = faiss.IndexIDMap(hnsw)
        elif kind == "ivf":
            if train is None or len(train) == 0:
                raise MedclrError("ivf index: needs training vectors")
            n = len(train)
            nlist = int(nlist or max(1, min(int(4 * math.sqrt(n)), n // 39 or 1)))
            quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
            sample = normalized(train)
            if len(sample) > 64 * nlist:
                sample = sample[np.random.default_rng(0).choice(len(sample), 64 * nlist, replace=False)]
            index.train(sample)
            index.nprobe = min(IVF_NPROBE, nlist)
        else:
            raise MedclrError(f"index kind {kind!r}: expected one of {list(KINDS[1:])}")
        return cls(index, kind, use_gpu)

    def set_gpu(self, use_gpu: bool | str = "auto") -> None:
        """Clone to GPU 0 for search when asked (``True``) or when possible (``"auto"``)."""
        self._gpu = None
        want = gpu_available() if use_gpu == "auto" else bool(use_gpu)
        if not want:
            return
        if not gpu_available():
            raise MedclrError("--gpu: faiss has no GPU support here (install faiss-gpu) or no GPU is visible")
        if self.kind == "hnsw":
            log.info("faiss: HNSW has no GPU implementation; searching on the CPU")
            return
        faiss = _faiss()
        self._res = self._res or faiss.StandardGpuResources()
        self._gpu = faiss.index_cpu_to_gpu(self._res, 0, self.cpu)

    @property
    def on_gpu(self) -> bool:
        return self._gpu is not None

    # -- use -----------------------------------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        return int(self.cpu.ntotal)

    @property
    def dim(self) -> int:
        return int(self.cpu.d)

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        x = normalized(vectors)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if x.shape[0] != ids.shape[0]:
            raise MedclrError(f"index add: {x.shape[0]} vectors but {ids.shape[0]} ids")
        if x.shape[0] == 0:
            return
        if x.shape[1] != self.dim:
            raise MedclrError(f"index add: vectors have dim {x.shape[1]}, the index holds dim {self.dim}")
        self.cpu.add_with_ids(x, ids)
        if self._gpu is not None:  # keep the GPU copy in step
            self.set_gpu(True)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(cosines N x k float32, ids N x k int64); missing neighbours have id -1."""
        q = normalized(queries)
        if q.shape[1] != self.dim:
            raise MedclrError(f"query has dim {q.shape[1]}, the index holds dim {self.dim}")
        k = max(1, min(int(k), max(self.ntotal, 1)))
        if self.ntotal == 0:
            return np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64)
        faiss = _faiss()
        if self._gpu is None and len(q) < SMALL_BATCH:
            before = faiss.omp_get_max_threads()
            faiss.omp_set_num_threads(1)  # per calling thread (OpenMP ICV)
            try:
                return self.cpu.search(q, k)
            finally:
                faiss.omp_set_num_threads(before)
        return (self._gpu or self.cpu).search(q, k)

    # -- files ---------------------------------------------------------------------------------------
    def write(self, path: str | os.PathLike) -> None:
        _faiss().write_index(self.cpu, str(path))

    @classmethod
    def read(cls, path: str | os.PathLike, kind: str, use_gpu: bool | str = "auto") -> VectorIndex:
        try:
            index = _faiss().read_index(str(path))
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
            raise MedclrError(f"{Path(path)}: not a readable faiss index ({first[:160]})") from None
        return cls(index, kind, use_gpu)
