"""The three graphs an ONNX or TorchScript export holds, as traceable modules, and the export they make.

* ``image_encoder``: images B x 1 x C x C float in [0, 1] -> ``global_embedding`` B x D (unit) and ``regions``
  B x D x h x w (the projected cells, not normalised); the grey-to-RGB repeat and the normalisation are inside.
* ``text_encoder``: ``input_ids``, ``attention_mask`` (B x L, from the saved tokenizer) -> ``text_embedding`` B x D
  (unit) and ``text_projection`` B x D (before normalisation: a side of several prompts averages these).
* ``score``: the head's image input (``regions`` for LSE+NL, non-local block included; ``global_embedding`` for
  the cosine head) and ``text_embeddings`` -> ``scores`` B_img x B_txt, the score zero-shot and retrieval use.

Batch axes (and the text's length) are dynamic. Both formats trace these modules on a batch of two and are
then checked on another batch (three images by default, the ten default prompts), so a shape frozen into the
graph fails the export instead of a user's run; the largest difference is kept in export.json.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.export.describe import FORMAT, common, preprocessing, text_input
from medclr.files import write_text
from medclr.hub import quiet_transformers
from medclr.inference import Inference
from medclr.models.image import ImageFeatures
from medclr.prompts import CHEX5_PROMPTS

TOLERANCE = 1e-4  # largest |exported - PyTorch| an export may keep
TOKENIZER_DIR = "tokenizer"
EXPORT_JSON = "export.json"
TRACE_BATCH = 2  # not 1: exporters specialise an axis of size 1 to a constant


class ImageGraph(nn.Module):
    input_names = ("images",)
    output_names = ("global_embedding", "regions")

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(images)
        return features.global_emb, features.regions


class TextGraph(nn.Module):
    input_names = ("input_ids", "attention_mask")
    # not "embedding": the ONNX exporter names an inner BERT value so. The projection before normalisation is
    # what a side of several prompts averages (medclr.prompts.reduce_prompts).
    output_names = ("text_embedding", "text_projection")

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(input_ids, attention_mask)
        return features.embedding, features.projected


class ScoreGraph(nn.Module):
    output_names = ("scores",)
    image_inputs = {"lse_nl": "regions", "cosine": "global_embedding"}

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        if head.kind not in self.image_inputs:
            raise MedclrError(f"head {head.kind!r}: export knows the heads {sorted(self.image_inputs)}")
        self.head = head
        self.input_names = (self.image_inputs[head.kind], "text_embeddings")

    def forward(self, image: torch.Tensor, text_embeddings: torch.Tensor) -> torch.Tensor:
        # each head reads one field of the features (LSE+NL the regions, cosine the global embedding), so the
        # graph takes just that one and fills both
        return self.head(ImageFeatures(regions=image, global_emb=image), text_embeddings)


@dataclass
class Graph:
    """One graph to export: its module, inputs to trace with, inputs to check with (another batch), and the
    dynamic axes of its inputs and outputs by name."""

    name: str
    module: nn.Module
    example: dict[str, torch.Tensor]
    check: dict[str, torch.Tensor]
    dynamic: dict[str, dict[int, str]]
    output_dynamic: dict[int, str]

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.module.output_names


def _images(n: int, size: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed))


def _sentences() -> list[str]:
    """The default prompts: sentences of several lengths, so the check batch is padded."""
    return [s for sides in CHEX5_PROMPTS.values() for side in ("positive", "negative") for s in sides[side]]


def build_graphs(inference: Inference, check_batch: int) -> list[Graph]:
    """The three graphs of ``inference``'s model."""
    if check_batch < 1:
        raise MedclrError(f"--batch {check_batch}: expected at least 1 image for the parity check")
    model = inference.model
    size = int(inference.preprocess.image_size)
    image, text, score = (ImageGraph(model.image_encoder).eval(), TextGraph(model.text_encoder).eval(),
                          ScoreGraph(model.head).eval())

    def tokens(sentences: list[str]) -> dict[str, torch.Tensor]:
        batch = model.text_encoder.tokenize(sentences)
        return {k: batch[k] for k in text.input_names}

    images = {"example": _images(TRACE_BATCH, size, 0), "check": _images(check_batch, size, 1)}
    texts = {"example": tokens(_sentences()[:TRACE_BATCH]), "check": tokens(_sentences())}
    image_field = image.output_names.index(score.input_names[0])
    with torch.no_grad():
        scored = {k: dict(zip(score.input_names, (image(images[k])[image_field], text(**texts[k])[0])))
                  for k in ("example", "check")}
    return [
        Graph("image_encoder", image, {"images": images["example"]}, {"images": images["check"]},
              {"images": {0: "batch"}}, {0: "batch"}),
        Graph("text_encoder", text, texts["example"], texts["check"],
              {k: {0: "batch", 1: "sequence"} for k in text.input_names}, {0: "batch"}),
        Graph("score", score, scored["example"], scored["check"],
              dict(zip(score.input_names, ({0: "images"}, {0: "texts"}))), {0: "images", 1: "texts"}),
    ]


# Each format: how to write a graph to a file, and how to run that file back (inputs -> outputs as arrays).
Save = Callable[[Graph, Path], None]
Run = Callable[[Path, Mapping[str, np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class Format:
    kind: str
    suffix: str
    runtime: str  # what the parity check ran the exported files with
    save: Save
    run: Run


def write_graph_export(inference: Inference, folder: Path, fmt: Format, check_batch: int) -> dict[str, Any]:
    """Write the three graphs in ``fmt``, the tokenizer and export.json into ``folder``; every graph is run back
    with the format's runtime and must equal PyTorch within :data:`TOLERANCE`. Returns export.json's record."""
    graphs = build_graphs(inference, check_batch)
    described, diffs = {}, {}
    for graph in graphs:
        path = folder / f"{graph.name}{fmt.suffix}"
        fmt.save(graph, path)
        diffs[graph.name] = _parity(graph, fmt.run(path, {k: v.numpy() for k, v in graph.check.items()}), fmt.kind)
        described[graph.name] = _describe(graph, path.name)
    with quiet_transformers():
        inference.model.tokenizer.save_pretrained(folder / TOKENIZER_DIR)
    record = {"format": FORMAT, "kind": fmt.kind, "graphs": described,
              "image": preprocessing(inference, normalised_in_graph=True),
              "text": text_input(inference, TOKENIZER_DIR), **common(inference),
              "parity": {"runtime": fmt.runtime, "tolerance": TOLERANCE, "max_abs_diff": diffs,
                         "batch": {"images": check_batch, "texts": len(_sentences())}}}
    write_text(folder / EXPORT_JSON, json.dumps(record, indent=2) + "\n")
    return record


def _parity(graph: Graph, outputs: list[np.ndarray], kind: str) -> float:
    with torch.no_grad():
        expected = graph.module(*graph.check.values())
    expected = expected if isinstance(expected, tuple) else (expected,)
    if len(outputs) != len(expected):
        raise MedclrError(f"{kind} {graph.name}: gives {len(outputs)} outputs, PyTorch {len(expected)}")
    worst = 0.0
    for name, want, got in zip(graph.output_names, expected, outputs):
        if tuple(got.shape) != tuple(want.shape):
            raise MedclrError(f"{kind} {graph.name}: output {name} has shape {tuple(got.shape)} on the check batch, "
                              f"PyTorch {tuple(want.shape)}: the export froze a batch axis")
        worst = max(worst, float(np.abs(got.astype(np.float64) - want.double().numpy()).max(initial=0.0)))
    if not math.isfinite(worst) or worst > TOLERANCE:
        raise MedclrError(f"{kind} {graph.name}: differs from PyTorch by {worst:.2e} (> {TOLERANCE:g}); "
                          "nothing was written")
    return worst


def _describe(graph: Graph, file: str) -> dict[str, Any]:
    """The file and its inputs' and outputs' shapes, dynamic axes by name."""
    with torch.no_grad():
        outputs = graph.module(*graph.example.values())
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)

    def shape(t: torch.Tensor, dynamic: Mapping[int, str]) -> list[int | str]:
        return [dynamic.get(i, int(n)) for i, n in enumerate(t.shape)]

    return {"file": file,
            "inputs": {k: {"shape": shape(v, graph.dynamic[k]), "dtype": str(v.dtype).removeprefix("torch.")}
                       for k, v in graph.example.items()},
            "outputs": {k: {"shape": shape(v, graph.output_dynamic), "dtype": str(v.dtype).removeprefix("torch.")}
                        for k, v in zip(graph.output_names, outputs)}}
