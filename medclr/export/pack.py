"""`medclr models pack`: a trained checkpoint as a shipped model, the folder ``<root>/<NAME>/`` (docs/models.md).

Only what inference reads is copied: ``config.json``, ``tokenizer/``, ``model.safetensors`` (its floating
tensors cast to float16 with ``fp16=True``: half the bytes; the model loads them back into float32 to compute)
and ``checkpoint_meta.json``, which records the SHA-256 of the weights written. The stored CheX5 prompt embeddings
are recomputed for those weights, so the loader's checks hold and `medclr score` needs no text tower. What the
cast changes is measured, not assumed: the CheX5 zero-shot probabilities of a few images (CXR-Phantom renders, or
``images``) through the source and the packed model, the largest difference recorded in ``model.json`` and
reported. ``provenance/`` gets the caller's folder (commands, commit, seeds, logs) and what the packer knows:
``pack.json``, the checkpoint's training config, state and log (``checkpoint/``), the validation record, the eval
report (``eval/``) and a model card. ``model.json`` and ``SHA256SUMS`` come last.

The folder is assembled beside its target (``.pack-<NAME>.tmp``, never listed: names start with a letter or a
digit) and renamed into place, so a shipped model is complete or absent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medclr import __version__
from medclr.errors import MedclrError
from medclr.files import atomic_path, stable_safetensors, write_text
from medclr.pretrained import FORMAT, MODEL_JSON, NAME_RE, PROVENANCE_DIR, SUMS_NAME, folder_size, root, write_sums

# what the packer writes into provenance/ (a --provenance folder may not hold these names)
GENERATED = ("pack.json", "validation.json", "model_card.md", "checkpoint", "eval")
# the checkpoint's own record of its run, copied into provenance/checkpoint/ when present
CHECKPOINT_RECORD = ("train_config.yaml", "trainer_state.json", "metrics.jsonl")
N_IMAGES = 8  # CXR-Phantom renders the cast is measured on when no images are given
FLOAT16_MAX = 65504.0


def pack(checkpoint: str | Path, name: str, *, where: str | Path | None = None, fp16: bool = False,
         provenance: str | Path | None = None, report: str | Path | None = None, images: list[str] | None = None,
         description: str | None = None, overwrite: bool = False, command: list[str] | None = None) -> dict[str, Any]:
    """Write the shipped model ``name`` from ``checkpoint`` into ``where`` (default: :func:`medclr.pretrained.root`)
    and return what ``model.json`` says, with ``path`` and ``size_bytes``. ``report``: this checkpoint's `medclr eval`
    folder (headline metrics, the card); ``provenance``: a folder copied into ``provenance/``."""
    from medclr.inference import load_checkpoint

    if not NAME_RE.fullmatch(name):
        raise MedclrError(f"--name {name!r}: expected 1 to 64 lower-case letters, digits, '.', '_' or '-', starting "
                          "with a letter or a digit")
    base = Path(where).expanduser() if where is not None else root()
    target = base / name
    if target.exists() and not overwrite:
        raise MedclrError(f"{target}: exists; pass --overwrite to replace it")
    if provenance is not None and not Path(provenance).is_dir():
        raise MedclrError(f"--provenance {str(provenance)!r}: no such directory")
    clash = sorted(g for g in GENERATED if provenance is not None and (Path(provenance) / g).exists())
    if clash:
        raise MedclrError(f"--provenance {str(provenance)!r}: holds {', '.join(clash)}, which the packer writes "
                          "itself; rename them")
    for image in images or ():
        if not Path(image).is_file():
            raise MedclrError(f"--images {image!r}: no such file")
    from medclr.export.card import read_report

    source = load_checkpoint(checkpoint)  # verified (SHA-256, finite weights) and with its text tower
    metrics = read_report(report, source) if report is not None else None
    base.mkdir(parents=True, exist_ok=True)
    stage = base / f".pack-{name}.tmp"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        sha = _write_model(source.checkpoint_dir, stage, fp16)
        # as `medclr score` opens it: the stored prompts must serve the verified weights, without a text tower
        packed = load_checkpoint(stage, text=False, verify_weights=True)
        if packed.model.text_encoder is not None:
            raise MedclrError(f"{stage}: the stored prompt embeddings do not match the packed weights")
        cast = cast_change(source, packed, images)
        record = _model_json(name, source, sha, fp16, cast, metrics, description)
        _write_provenance(stage, source, metrics, report, provenance, record, command)
        write_text(stage / MODEL_JSON, json.dumps(record, indent=2) + "\n")
        write_sums(stage)
        _swap(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return {**record, "path": str(target), "size_bytes": folder_size(target)}


def _write_model(src: Path, stage: Path, fp16: bool) -> str:
    """The inference files of ``src`` into ``stage``; returns the SHA-256 of the weights written."""
    from medclr.inference import read_metadata, weights_sha256, write_metadata
    from medclr.inference.stored_prompts import save_prompt_embeddings
    from medclr.models.dual import CONFIG_NAME, TOKENIZER_DIR, WEIGHTS_NAME, DualEncoder
    from medclr.prompts import checkpoint_prompts

    stage.mkdir(parents=True)
    shutil.copyfile(src / CONFIG_NAME, stage / CONFIG_NAME)
    shutil.copytree(src / TOKENIZER_DIR, stage / TOKENIZER_DIR)
    if fp16:
        cast_weights(src / WEIGHTS_NAME, stage / WEIGHTS_NAME)
    else:
        shutil.copyfile(src / WEIGHTS_NAME, stage / WEIGHTS_NAME)
    sha = weights_sha256(stage)
    meta = dataclasses.replace(read_metadata(src), weights_sha256=sha)
    write_metadata(stage, meta)
    save_prompt_embeddings(stage, DualEncoder.from_pretrained(stage), sha, checkpoint_prompts(meta.findings)[1])
    return sha


def cast_weights(src: Path, dst: Path) -> None:
    """``src``'s safetensors with every floating tensor as float16 (its metadata kept). A weight beyond float16's
    range is refused rather than written as infinity."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), framework="pt") as fh:
        metadata = fh.metadata() or {}
    out = {}
    for key, t in load_file(str(src)).items():
        if t.is_floating_point() and t.dtype != torch.float16:
            big = float(t.abs().max()) if t.numel() else 0.0
            if math.isfinite(big) and big > FLOAT16_MAX:
                raise MedclrError(f"{src}: weight {key!r} reaches {big:.4g}, beyond float16's range ({FLOAT16_MAX:g}); "
                                  "pack it without --fp16")
            t = t.to(torch.float16)
        out[key] = t.contiguous()
    with atomic_path(dst) as tmp:
        save_file(out, str(tmp), metadata=metadata)
        stable_safetensors(tmp)


def cast_change(source, packed, images: list[str] | None = None) -> dict[str, Any]:
    """The largest change from ``source`` to ``packed`` of the CheX5 zero-shot probabilities (raw, before any
    calibration) and of the two scores behind them, on ``images`` (default: CXR-Phantom renders)."""
    inputs: list[Any] = list(images) if images else phantom_images(N_IMAGES, source.preprocess.resize_to)

    def scores(engine) -> tuple[list[str], np.ndarray, np.ndarray]:
        batch = torch.stack([engine.prepare(x)[0] for x in inputs])
        classes, prob, s_pos, s_neg = engine.zero_shot_scores(engine.image_features(batch))
        return list(classes), prob.astype(np.float64), np.stack([s_pos, s_neg]).astype(np.float64)

    (_, p0, s0), (classes, p1, s1) = scores(source), scores(packed)
    # the packed model's own probabilities: whoever opens it by name can check it still gives them
    return {"images": [str(x) for x in images] if images else f"{len(inputs)} CXR-Phantom renders (seed 0)",
            "n_images": len(inputs), "max_probability_change": float(np.abs(p1 - p0).max()),
            "max_score_change": float(np.abs(s1 - s0).max()), "classes": classes,
            "probabilities": np.round(p1, 6).tolist()}


def phantom_images(n: int, size: int) -> list[np.ndarray]:
    """``n`` CXR-Phantom radiographs (studies 0..n-1 of seed 0), uint8, ``size`` px: fixed inputs for a check."""
    from medclr.phantom import load_material, plan_study, render

    material = load_material()
    return [render(material, plan_study(material, "both", 0, k), max(int(size), 64))["image"] for k in range(n)]


def _recipe(source, config: dict[str, Any]) -> str:
    meta, model = source.meta, source.model
    parts = [meta.loss if meta is not None and meta.loss else "loss not recorded"]
    if meta is not None and meta.eta_source not in (None, "none"):
        parts.append(f"eta {meta.eta_source}")
    parts += [f"{model.head.kind} head", model.image_encoder.arch]
    if config.get("preset"):
        parts.append(f"preset {config['preset']}")
    return ", ".join(parts)


def _headline(source, metrics: dict[str, Any] | None) -> tuple[dict[str, float], str | None]:
    """The numbers ``medclr models`` shows, and the file they come from: the eval report's summary, else the mean
    validation AUC that training recorded, else none."""
    if metrics is not None:
        summary = {}
        for key, raw in (metrics.get("summary") or {}).items():
            value = raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
            if math.isfinite(value):
                summary[key] = round(float(value), 4)
        return summary, (f"{PROVENANCE_DIR}/eval/metrics.json (medclr eval, split {metrics.get('split')}, "
                         f"{metrics.get('n_images_encoded')} images)")
    findings = source.meta.findings if source.meta is not None else None
    aucs = [e["auc"] for e in ((findings or {}).get("classes") or {}).values()
            if isinstance(e.get("auc"), (int, float)) and math.isfinite(e["auc"])]
    if aucs:
        return ({"val_AUC": round(float(np.mean(aucs)), 4)},
                f"checkpoint_meta.json: validation at the end of training, mean of {len(aucs)} CheX5 AUCs "
                f"(split {findings.get('split')})")
    return {}, None


def _train_config(src: Path) -> dict[str, Any]:
    path = src / "train_config.yaml"
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_json(name: str, source, sha: str, fp16: bool, cast: dict[str, Any], metrics: dict[str, Any] | None,
                description: str | None) -> dict[str, Any]:
    meta, config = source.meta, _train_config(source.checkpoint_dir)
    headline, headline_source = _headline(source, metrics)
    return {"format": FORMAT, "name": name, "description": description or "", "recipe": _recipe(source, config),
            "preset": config.get("preset"), "seed": config.get("seed"), "loss": meta.loss if meta else None,
            "steps": meta.step if meta else None, "total_steps": meta.total_steps if meta else None,
            "dtype": "float16" if fp16 else "float32", "image_size": source.preprocess.image_size,
            "resize": source.preprocess.resize_to, "tau": source.tau, "headline": headline,
            "headline_source": headline_source, "weights_sha256": sha,
            "source_weights_sha256": source.weights_sha256, "cast": cast, "medclr_version": __version__}


def _write_provenance(stage: Path, source, metrics: dict[str, Any] | None, report: str | Path | None,
                      provenance: str | Path | None, record: dict[str, Any], command: list[str] | None) -> None:
    from medclr.export.card import model_card

    out = stage / PROVENANCE_DIR
    if provenance is not None:
        shutil.copytree(provenance, out)
    out.mkdir(exist_ok=True)
    src = source.checkpoint_dir
    for f in CHECKPOINT_RECORD:
        if (src / f).is_file():
            (out / "checkpoint").mkdir(exist_ok=True)
            shutil.copyfile(src / f, out / "checkpoint" / f)
    if metrics is not None:
        folder = Path(report).expanduser()
        if folder.is_dir():
            shutil.copytree(folder, out / "eval")
        else:
            (out / "eval").mkdir()
            shutil.copyfile(folder, out / "eval" / "metrics.json")
    findings = source.meta.findings if source.meta is not None else None
    if findings:
        write_text(out / "validation.json", json.dumps(findings, indent=2) + "\n")
    dtype = record["dtype"]
    files = {"config.json": "the model's structure (`medclr.dual_encoder/1`)",
             "model.safetensors": f"every weight, {dtype}" + (" (cast from the trained float32 weights named above; "
                                                              "they load back into float32)" if dtype == "float16" else ""),
             "tokenizer/": "the text tokenizer", "checkpoint_meta.json": "preprocessing, tau, the training record",
             "prompt_embeddings.safetensors": "the CheX5 prompts encoded for these weights",
             "model.json": "the summary `medclr models` shows", "provenance/": "how the model was made",
             SUMS_NAME: "the SHA-256 of every other file, checked whenever the model is opened by name"}
    loading = [f"`medclr.load(\"{record['name']}\")` in Python, or `--checkpoint {record['name']}` on any medclr command "
               "(docs/models.md, \"Shipped models\"). Nothing is downloaded."]
    write_text(out / "model_card.md", model_card(source, metrics, files, loading=loading, name=record["name"]))
    pack_record = {"source": str(Path(src).resolve()), "source_weights_sha256": record["source_weights_sha256"],
                   "weights_sha256": record["weights_sha256"], "dtype": dtype, "cast": record["cast"],
                   "command": command, "packed_with": {"medclr": __version__, "commit": _commit()}}
    write_text(out / "pack.json", json.dumps(pack_record, indent=2) + "\n")


def _commit() -> str | None:
    """The git commit of the medclr source that packed (``+dirty`` with uncommitted changes), None outside a
    checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def _swap(stage: Path, target: Path) -> None:
    """``stage`` becomes ``target``; an old ``target`` is removed only once the new one is in place."""
    old = target.with_name(f".pack-{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    stage.rename(target)
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["cast_change", "cast_weights", "pack", "phantom_images"]
