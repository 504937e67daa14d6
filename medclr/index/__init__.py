"""faiss retrieval index of a checkpoint's image and report-sentence embeddings (`medclr index`).

See docs/index.md. Cosine similarity = inner product of L2-normalised float32 vectors.
"""

from medclr.index.store import (
    FORMAT,
    MANIFEST_NAME,
    RetrievalIndex,
    add_to_index,
    build_index,
    load_index,
    read_meta,
)
from medclr.index.vectors import EXACT_MAX, KINDS, VectorIndex, choose_kind, gpu_available, normalized

__all__ = [
    "EXACT_MAX",
    "FORMAT",
    "KINDS",
    "MANIFEST_NAME",
    "RetrievalIndex",
    "VectorIndex",
    "add_to_index",
    "build_index",
    "choose_kind",
    "gpu_available",
    "load_index",
    "normalized",
    "read_meta",
]
