"""`medclr export --format onnx`: the three graphs (``medclr.export.graphs``) through torch's ONNX exporter
(``torch.onnx.export(..., dynamo=True)``, which needs onnx and onnxscript), checked with onnxruntime."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from medclr.errors import MedclrError
from medclr.export.graphs import Format, Graph, write_graph_export
from medclr.inference import Inference

INSTALL = "pip install 'medclr[export]'"
# protobuf caps one file at 2 GiB; above about this much weight the tensors go to a .onnx.data file beside it
EXTERNAL_DATA_BYTES = 1 << 30


def require_onnx() -> None:
    """One line naming the extra when a package the ONNX export needs is missing (before any work)."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            raise MedclrError(f"--format onnx needs the packages onnx, onnxscript and onnxruntime ({name} is "
                              f"missing): {INSTALL}") from None


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter prints its steps to stdout (a command's stdout is its result) and logs every optimisation
    pass at INFO; it warns that two inputs share an axis name, which is what the names say."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [log.level for log in loggers]
    try:
        for log in loggers:
            log.setLevel(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
            yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _save(graph: Graph, path: Path) -> None:
    import torch

    axes = {}  # one Dim object per axis name, so inputs that share a name (input_ids, attention_mask) share a size
    dynamic = tuple({i: axes.setdefault(n, torch.export.Dim(n)) for i, n in graph.dynamic[k].items()}
                    for k in graph.example)  # by position: the input names are not always forward's argument names
    weight_bytes = sum(p.numel() * p.element_size() for p in graph.module.state_dict().values())
    with _quiet_exporter():
        torch.onnx.export(graph.module, tuple(graph.example.values()), str(path), dynamo=True,
                          input_names=list(graph.example), output_names=list(graph.output_names),
                          dynamic_shapes=dynamic, external_data=weight_bytes > EXTERNAL_DATA_BYTES)


def _run(path: Path, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, dict(inputs))


def _format() -> Format:
    import onnxruntime

    return Format("onnx", ".onnx", f"onnxruntime {onnxruntime.__version__} (CPU)", _save, _run)


def write(inference: Inference, folder: Path, check_batch: int) -> dict[str, Any]:
    require_onnx()
    return write_graph_export(inference, folder, _format(), check_batch)
