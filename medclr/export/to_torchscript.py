"""`medclr export --format torchscript`: the three graphs (``medclr.export.graphs``) traced with ``torch.jit.trace``,
saved for ``torch.jit.load``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medclr.export.graphs import Format, Graph, write_graph_export
from medclr.hub import quiet_transformers
from medclr.inference import Inference


@contextmanager
def _quiet_jit() -> Iterator[None]:
    with warnings.catch_warnings(), quiet_transformers():
        # the tracer warns at every Python-level shape check (the parity check on another batch is what tells
        # whether a shape was frozen), and torch >= 2.9 marks TorchScript deprecated (docs/export.md, limitations)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.jit.*deprecated", category=FutureWarning)
        # tracing reads every attribute of the text model: transformers then warns of its own deprecated
        # properties (`is_gradient_checkpointing`) and logs that the config's loss_type=None is unknown; neither
        # is about the export (quiet_transformers holds its log lines)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
        yield


def _save(graph: Graph, path: Path) -> None:
    with _quiet_jit():
        traced = torch.jit.trace(graph.module, tuple(graph.example.values()), check_trace=False)
        torch.jit.save(traced, str(path))


def _run(path: Path, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with _quiet_jit():
        module = torch.jit.load(str(path), map_location="cpu")
    with torch.no_grad():
        out = module(*(torch.from_numpy(v) for v in inputs.values()))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


TORCHSCRIPT = Format("torchscript", ".pt", f"torch.jit.load (torch {torch.__version__})", _save, _run)


def write(inference: Inference, folder: Path, check_batch: int) -> dict[str, Any]:
    return write_graph_export(inference, folder, TORCHSCRIPT, check_batch)
