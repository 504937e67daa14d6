"""What an export says about the model in JSON, the same words in every format: the input convention and
preprocessing, the text side, the zero-shot prompts, and where the weights came from."""

from __future__ import annotations

import dataclasses
from typing import Any

from medclr.inference import Inference
from medclr.inference.metadata import NOT_RECORDED

FORMAT = "medclr.export/1"  # the "format" of config.json (hf) and export.json (onnx, torchscript)


def preprocessing(inference: Inference, normalised_in_graph: bool) -> dict[str, Any]:
    """The image pipeline before the model (docs/evaluation.md 1.1, ``medclr.geometry``), and the normalisation:
    inside the exported graph (onnx, torchscript) or the caller's to apply (hf)."""
    encoder = inference.model.image_encoder
    pre = inference.preprocess
    return {
        "input": "one grey image, float32 H x W in [0, 1], air dark and bone bright (medclr.io.read_image)",
        "resize_shorter_side": pre.resize_to,
        "centre_crop": int(pre.image_size),
        "resize_method": "torch.nn.functional.interpolate, mode 'area' when shrinking, 'bilinear' "
                         "(align_corners=False) when enlarging; longer side round(long * R / short); then values "
                         "clipped to [0, 1]",
        "crop_start": "size // 2 - crop // 2 on each axis",
        "normalisation": {
            "grey_to_rgb": "repeat the grey channel 3 times",
            # the float32 buffers, rounded back to the decimals they were given in
            "mean": [round(float(v), 6) for v in encoder.mean.flatten()],
            "std": [round(float(v), 6) for v in encoder.std.flatten()],
            "applied": "inside the image graph (feed [0, 1] grey)" if normalised_in_graph else
                       "by the caller: (rgb - mean) / std per channel before the trunk",
        },
    }


def text_input(inference: Inference, tokenizer_folder: str) -> dict[str, Any]:
    encoder = inference.model.text_encoder
    strip = ("strip trailing '.', '?', '!' and spaces from each sentence before tokenising"
             if encoder.strip_punctuation else "none")
    return {"tokenizer": tokenizer_folder, "max_length": encoder.max_length, "padding": "longest in the batch",
            "truncation": True, "sentence_cleanup": strip, "pooling": encoder.pooling,
            "projection": encoder.projection_kind, "token_type_ids": "not fed (all zero)"}


def prompts(inference: Inference) -> dict[str, Any]:
    """The zero-shot prompts the checkpoint's findings record was fitted with, and how they are scored."""
    return {"name": inference.prompts_name, "sets": inference.default_prompts,
            "reduction": "several prompts on a side: mean of the unnormalised projections, then L2-normalised",
            "zero_shot": "P(finding) = sigmoid((score(image, positive) - score(image, negative)) / tau); the findings "
                         "record's Platt calibration replaces it where a finding is read"}


def provenance(inference: Inference) -> dict[str, Any]:
    """The checkpoint it came from: its weights' SHA-256 and what training recorded (checkpoint_meta.json)."""
    from medclr import __version__

    meta = inference.meta
    training = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)
                if f.name not in (*NOT_RECORDED, "findings")} if meta is not None else {}
    return {"checkpoint": str(inference.checkpoint_dir.resolve()) if inference.checkpoint_dir else None,
            "weights_sha256": inference.weights_sha256, "medclr_version": __version__, "training": training}


def common(inference: Inference) -> dict[str, Any]:
    """What every format's JSON holds beside its own files."""
    meta = inference.meta
    return {"joint_dim": inference.joint_dim, "tau": inference.tau, "head": inference.model.head.to_config(),
            "prompts": prompts(inference), "findings": meta.findings if meta is not None else None,
            "source": provenance(inference)}
