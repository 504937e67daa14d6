"""BioViL or BioViL-T + CXR-BERT as published, written as a medclr checkpoint without a corpus (`medclr import biovil`).

The model is the one ``medclr train`` builds from the same files with ``train.max_steps=0`` (``build_dual_encoder``
with BioViL's image file, the CXR-BERT folder, ``pooling="cls"``, the cosine head): every weight comes from the two
files and none is trained, so the data a training run reads (the manifest, the image cache at 512 px, the
validation pass) adds nothing to the weights. The checkpoint is the one `medclr train` writes, less what only
training has: ``config.json``, ``model.safetensors``, ``tokenizer/``, ``prompt_embeddings.safetensors`` and
``checkpoint_meta.json`` with the weights' SHA-256; beside them ``import.json`` records the two sources and their
SHA-256. With no validation split there is no per-finding record (``findings``): `medclr score` and the app then give
the uncalibrated zero-shot probability, "not validated", as for any checkpoint without one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from medclr.errors import MedclrError
from medclr.files import file_sha256, refuse_foreign, write_text

log = logging.getLogger(__name__)

IMPORT_NAME = "import.json"
IMPORT_FORMAT = "medclr.import/1"
TAU = 0.07  # what a train.max_steps=0 run records: the InfoNCE config's temperature (training/configs/infonce.yaml)
MAX_LENGTH = 64  # medclr train's model.max_length (training/configs/base.yaml)


def is_import(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier `medclr import` (its import.json says so): replaced without --overwrite."""
    try:
        return json.loads((folder / IMPORT_NAME).read_text(encoding="utf-8")).get("format") == IMPORT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _text_files(folder: Path) -> dict[str, str]:
    """SHA-256 of the text folder's files (weights, config, vocabulary), by name."""
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def _cxr_bert_head_size(folder: Path) -> int:
    """The output size of the CXR-BERT folder's projection head; one line when ``folder`` is not CXR-BERT or has none."""
    from medclr.models.hub import cxr_bert_config, read_prefixed_tensors

    if not (folder / "config.json").is_file():
        raise MedclrError(f"--text {folder}: no config.json (expected a CXR-BERT folder, e.g. a local copy of "
                          "microsoft/BiomedVLP-CXR-BERT-specialized)")
    if cxr_bert_config(folder) is None:
        raise MedclrError(f"--text {folder}: not a CXR-BERT folder (its config.json has no model_type 'cxr-bert'); "
                          "another text model needs training: `medclr train model.text=...`")
    head = read_prefixed_tensors(folder, "cls_projection_head.")
    if "dense_to_output.weight" not in head:
        raise MedclrError(f"--text {folder}: no cls_projection_head.* weights, so no published text projection")
    return int(head["dense_to_output.weight"].shape[0])


def import_biovil(image_weights: str | os.PathLike, text: str | os.PathLike, out: str | os.PathLike, *,
                  resize: int | None = None, crop: int | None = None, tau: float = TAU, max_length: int = MAX_LENGTH,
                  overwrite: bool = False) -> dict:
    """Write BioViL (or BioViL-T) + CXR-BERT as published to the checkpoint folder ``out``; returns a summary.

    ``image_weights``: hi-ml-multimodal's image model file; ``text``: a local CXR-BERT folder. ``resize``/``crop``:
    the preprocessing the checkpoint records (default the papers': 512, then 480 for BioViL and 448 for BioViL-T);
    ``tau``: the zero-shot temperature; ``max_length``: sentence tokens. ``out`` is written whole or not at all; an
    earlier import there is replaced, anything else is refused unless ``overwrite``.
    """
    import torch

    from medclr.export.exporter import _staging
    from medclr.inference.checkpoint import weights_sha256
    from medclr.inference.metadata import CheckpointMeta, write_metadata
    from medclr.inference.stored_prompts import save_prompt_embeddings
    from medclr.models.biovil import CROP, RESIZE, read_biovil_weights
    from medclr.models.dual import build_dual_encoder
    from medclr.prompts import CHEX5_PROMPTS  # an imported model has no findings record: the paper's prompts

    t0 = time.monotonic()
    target, image_path, text_dir = Path(out).expanduser(), Path(image_weights).expanduser(), Path(text).expanduser()
    if target.exists() and not target.is_dir():
        raise MedclrError(f"--out {target}: is a file; expected a folder for the checkpoint")
    refuse_foreign(target, is_import, "an earlier `medclr import`", overwrite=overwrite)
    if not text_dir.is_dir():
        raise MedclrError(f"--text {text_dir}: no such folder (expected a local CXR-BERT folder)")
    for name, value, low in (("--tau", tau, 0.0), ("--max-length", max_length, 2)):
        if not value > low:
            raise MedclrError(f"{name} {value}: expected a number > {low:g}")
    head_size = _cxr_bert_head_size(text_dir)
    image = read_biovil_weights(image_path)  # one line when it is not hi-ml-multimodal's image file
    kind, arch, joint = image.kind, image.arch, image.joint_dim
    del image  # build_dual_encoder reads it again into the tower; the mapped copy would double the peak memory
    if head_size != joint:
        raise MedclrError(f"--text {text_dir}: its projection head gives {head_size} values, the image file's projector "
                          f"{joint}: not a published pair (BioViL and CXR-BERT-specialized are both 128)")
    resize = RESIZE if resize is None else int(resize)
    crop = CROP[kind] if crop is None else int(crop)
    if not 32 <= crop <= resize:
        raise MedclrError(f"--crop {crop} --resize {resize}: expected 32 <= crop <= resize")

    torch.manual_seed(0)  # as a training run seeds it; every tensor below comes from the two files anyway
    model = build_dual_encoder(text_dir, arch=arch, joint_dim=joint, head="cosine", image_pretrained="biovil",
                               image_weights=image_path, projector="mlp", pooling="cls", max_length=max_length,
                               stages=4, output_stride=32)
    if model.text_encoder.projection_kind != "cxrbert":  # a fresh random projection would not be "as published"
        raise MedclrError(f"--text {text_dir}: its projection head could not be used")
    model.eval()
    record = {"format": IMPORT_FORMAT, "kind": kind, "image_weights": str(image_path.resolve()),
              "image_weights_sha256": file_sha256(image_path), "text": str(text_dir.resolve()),
              "text_files_sha256": _text_files(text_dir)}
    with _staging(target) as folder:
        model.save_pretrained(folder)
        sha = weights_sha256(folder)
        save_prompt_embeddings(folder, model, sha, CHEX5_PROMPTS)  # scoring then needs no text tower
        write_metadata(folder, CheckpointMeta(image_size=crop, resize=resize, tau=float(tau), weights_sha256=sha))
        write_text(folder / IMPORT_NAME, json.dumps(record, indent=2) + "\n")
    summary = {"out": str(target), "kind": kind, "arch": arch, "joint_dim": joint, "resize": resize, "crop": crop,
               "tau": float(tau), "weights_sha256": sha, "seconds": round(time.monotonic() - t0, 1)}
    log.info("%s + CXR-BERT as published: %s (%s, joint %d, resize %d, crop %d); no per-finding validation record, so "
             "zero-shot probabilities are uncalibrated; %.1f s", kind, target, arch, joint, resize, crop,
             summary["seconds"])
    return summary
