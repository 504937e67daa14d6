"""The checkpoint directory contract: what a `medclr train` output dir records, and loading it for inference.

One module reads and writes the side files (``preprocess.json``, ``config.json``, training's config and
state, ``loss_state.safetensors``) so that training, which writes them, and every consumer, which reads
them, agree on names and keys. :func:`read_checkpoint_info` finds ``image_size``, ``resize``, ``tau``,
the eta table and the manifest; :func:`medclr.inference.load.load_checkpoint` puts them together into
an :class:`~medclr.inference.engine.Inference` (this module imports no engine: the engine imports it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from medclr.files import write_text
from medclr.inference.preprocess import Preprocess
from medclr.models.dual import CONFIG_NAME, WEIGHTS_NAME

log = logging.getLogger(__name__)

PREPROCESS_NAME = "preprocess.json"  # {"image_size": C, "resize": R} written by training
LOSS_STATE_NAME = "loss_state.safetensors"
# loss_state.safetensors: per-sample tables (u, zeta) are indexed by the row's position in the training
# split; this tensor beside them maps each position to the manifest `index` (written by training).
SAMPLE_INDEX_KEY = "sample_manifest_index"
DEFAULT_TAU = 1.0 / 14.0  # the paper initialises the hypersphere radius at sqrt(14): tau = 1/gamma^2
_TRAIN_FILES = ("train_config.yaml", "train_config.json", "config.yaml", "trainer_state.json")
# dotted keys looked up (in order) in preprocess.json, config.json and the training files
_KEYS = {
    "image_size": ("image_size", "preprocess.image_size", "image.image_size", "data.image_size", "data.crop_size",
                   "model.image_size", "training.data.image_size"),
    "resize": ("resize", "preprocess.resize", "image.resize", "data.resize", "training.data.resize"),
    "tau": ("tau", "loss.tau", "training.loss.tau", "inference.tau"),
    "eta_table": ("eta_table", "data.eta", "data.eta_table", "training.data.eta", "inference.eta_table"),
    "manifest": ("data.manifest", "manifest", "training.data.manifest"),
}


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _read_structured(path: Path) -> dict[str, Any]:
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(path.read_text())
        else:
            data = json.loads(path.read_text())
    except Exception as exc:  # noqa: BLE001 - a broken side file must not stop loading the model
        log.warning("checkpoint file %s is unreadable (%s); ignored", path, type(exc).__name__)
        return {}
    return data if isinstance(data, dict) else {}


def read_checkpoint_info(directory: str | os.PathLike) -> dict[str, Any]:
    """Preprocessing and training facts of a checkpoint dir: ``image_size``, ``resize``, ``tau``,
    ``eta_table`` (absolute path or None), ``manifest``, and ``source`` (which file said so).

    Looked up, first hit wins, in ``preprocess.json`` (the contract: ``{"image_size": C, "resize": R}``),
    ``config.json`` (sections ``preprocess``, ``image``, ``training``), then training's
    ``train_config.yaml`` / ``trainer_state.json`` (keys such as ``data.image_size``, ``loss.tau``,
    ``data.eta``)."""
    src = Path(directory)
    docs = [(name, _read_structured(src / name)) for name in (PREPROCESS_NAME, CONFIG_NAME, *_TRAIN_FILES)
            if (src / name).is_file()]
    info: dict[str, Any] = {"source": {}}
    for field, keys in _KEYS.items():
        info[field] = None
        for name, data in docs:
            hit = next((v for v in (_lookup(data, k) for k in keys) if v not in (None, "")), None)
            if hit is not None:
                info[field], info["source"][field] = hit, name
                break
    for field in ("eta_table", "manifest"):
        if info[field] is not None:
            p = Path(str(info[field])).expanduser()
            info[field] = str(p if p.is_absolute() or p.exists() else (src / p))
    return info


def write_preprocess(directory: str | os.PathLike, image_size: int, resize: int | None = None) -> Path:
    """Write ``preprocess.json`` into a checkpoint dir (what training should call)."""
    Preprocess(int(image_size), None if resize is None else int(resize))  # validates
    out = Path(directory) / PREPROCESS_NAME
    return write_text(out, json.dumps({"image_size": int(image_size), "resize": int(resize or image_size)}, indent=2))


def weights_sha256(directory: str | os.PathLike) -> str:
    """SHA-256 of the checkpoint's ``model.safetensors`` (identifies the model an index was built from)."""
    h = hashlib.sha256()
    with open(Path(directory) / WEIGHTS_NAME, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _loss_tau(directory: Path) -> float | None:
    path = directory / LOSS_STATE_NAME
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                name = key.rsplit(".", 1)[-1]
                if name in ("tau", "log_tau", "logit_scale"):
                    v = float(fh.get_tensor(key).float().reshape(-1)[0])
                    return {"tau": v, "log_tau": math.exp(v), "logit_scale": math.exp(-v)}[name]
    except Exception:  # noqa: BLE001
        return None
    return None
