"""``checkpoint_meta.json``: what a checkpoint records for its readers, in one versioned schema.

Training writes it at every save (:func:`write_metadata`); inference, evaluation, the index and the
app read it with :func:`read_metadata` and nothing else. The model's structure stays in
``config.json`` (the :class:`~medclr.models.dual.DualEncoder` format); this file holds what that one
cannot know: the preprocessing the model was trained for, the loss and its temperature, the eta
table, how far training got and on which data.

Versions: ``format_version`` is an integer. A change to the fields raises it and adds a step to
:func:`migrate`, the one place that lifts an older record to the current one; a file from a newer
medclr is refused with one line. Checkpoints made before the file existed (version 0) recorded the
same facts in side files under several spellings (``_LEGACY``); :func:`migrate` reads those too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medclr.errors import MedclrError
from medclr.files import read_json_object, write_text
from medclr.inference.preprocess import DEFAULT_IMAGE_SIZE

log = logging.getLogger(__name__)

METADATA_NAME = "checkpoint_meta.json"
FORMAT_VERSION = 3
# From this version on training records ``weights_sha256`` at every save: a record of such a version without it was
# not written by training, and load_checkpoint refuses it (its weights cannot be verified).
WEIGHTS_SHA256_SINCE = 3
LOSS_STATE_NAME = "loss_state.safetensors"


@dataclass(frozen=True)
class CheckpointMeta:
    """Version 3 of ``checkpoint_meta.json``. Only ``image_size`` is required; unknown facts are None."""

    image_size: int  # C: the centre crop the model sees (training's data.crop)
    resize: int | None = None  # R: the shorter side before the crop (None: R = C)
    tau: float | None = None  # the loss's temperature (None: the loss has none)
    loss: str | None = None  # loss.name
    eta_source: str | None = None  # where the loss's eta came from: none | lm | true | study_prior
    eta_table: str | None = None  # the eta table the config named (absolute path)
    manifest: str | None = None  # the manifest trained on (absolute path)
    split: str | None = None  # its split that was trained on
    data_fingerprint: str | None = None  # of the training rows, as resume checks them
    n_train: int | None = None  # training pairs
    global_batch: int | None = None
    step: int | None = None  # optimizer steps done at this save
    total_steps: int | None = None
    last_loss: float | None = None
    # Version 2: which findings the model reads, from the end-of-training validation (medclr.findings:
    # per finding AUC with CI, direction, Platt calibration); None = not validated.
    findings: dict | None = None
    # Version 3: the eta trained on when training recomputed it from the table's PLL (data.eta_a / eta_k):
    # {"a", "k", "eta_max"}; None = the table's own eta column (or no eta at all).
    eta_override: dict | None = None
    # Version 3: SHA-256 of model.safetensors as training wrote it; load_checkpoint refuses weights that differ
    # (None: not recorded, older checkpoints: only the finite-weights check applies).
    weights_sha256: str | None = None
    # Not written: which file gave each field (``checkpoint_meta.json``, or an old side file).
    source: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    # Not written: the format_version of the file as read, before migrate (0: no checkpoint_meta.json, side files).
    read_version: int = field(default=FORMAT_VERSION, compare=False, repr=False)

    @property
    def lacks_weights_sha256(self) -> bool:
        """Whether the record should hold ``weights_sha256`` (its version always records it) but does not."""
        return self.weights_sha256 is None and self.read_version >= WEIGHTS_SHA256_SINCE


_PATH_FIELDS = ("eta_table", "manifest")
NOT_RECORDED = ("source", "read_version")  # fields of CheckpointMeta that the file does not hold


def _recorded() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(CheckpointMeta) if f.name not in NOT_RECORDED]


def _required() -> list[str]:
    return [f.name for f in _recorded() if f.default is dataclasses.MISSING]


def _kinds(name: str) -> tuple[type, ...]:
    hint = typing.get_type_hints(CheckpointMeta)[name]
    return tuple(t for t in typing.get_args(hint) or (hint,) if t is not types.NoneType)


def _fits(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return False
    if float in kinds and isinstance(value, (int, float)):
        return math.isfinite(value)
    return isinstance(value, kinds)


def write_metadata(directory: str | os.PathLike, meta: CheckpointMeta) -> Path:
    """Write ``checkpoint_meta.json`` (current version, every field, null when unknown) atomically."""
    record = {"format_version": FORMAT_VERSION, **{f.name: getattr(meta, f.name) for f in _recorded()}}
    _check(record, {}, Path(directory))
    return write_text(Path(directory) / METADATA_NAME, json.dumps(record, indent=2) + "\n")


def read_metadata(directory: str | os.PathLike) -> CheckpointMeta:
    """The checkpoint's metadata, from ``checkpoint_meta.json`` or, for older checkpoints, migrated."""
    src = Path(directory).expanduser()
    path = src / METADATA_NAME
    raw = read_json_object(path) if path.is_file() else None
    record, source = migrate(src, raw)
    _check(record, source, src)
    values = {k: v for k, v in record.items() if k != "format_version"}
    for name in _PATH_FIELDS:
        if values.get(name) is not None:
            values[name] = _resolve(values[name], src)
    return CheckpointMeta(**values, source=source, read_version=0 if raw is None else int(raw["format_version"]))


def migrate(directory: Path, raw: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Lift a record of any earlier version to :data:`FORMAT_VERSION`: (record, field -> file it came from).

    ``raw`` is the content of ``checkpoint_meta.json``, or None where the checkpoint has none (version 0:
    the side files). Version 1 -> 2 added ``findings`` (None: not validated), 2 -> 3 ``eta_override`` (None: the
    eta table's own column) and ``weights_sha256`` (None: not recorded). A later version adds its step here."""
    if raw is None:
        return _from_side_files(directory)
    version = raw.get("format_version")
    where = directory / METADATA_NAME
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise MedclrError(f"{where}: format_version {version!r}, expected an integer from 1 to {FORMAT_VERSION}")
    if version > FORMAT_VERSION:
        raise MedclrError(f"{where}: format_version {version} is newer than this medclr reads ({FORMAT_VERSION}); "
                          "upgrade medclr to load this checkpoint")
    record = dict(raw)
    if version == 1:
        record.update(findings=None)
    if version <= 2:
        record.update(format_version=3, eta_override=None, weights_sha256=None)
    return record, {k: METADATA_NAME for k, v in raw.items() if v is not None and k != "format_version"}


def _check(record: Mapping[str, Any], source: Mapping[str, str], directory: Path) -> None:
    known = {f.name for f in _recorded()} | {"format_version"}
    for name in record:
        if name not in known:
            raise MedclrError(f"{directory / METADATA_NAME}: unknown field {name!r} (format_version "
                              f"{FORMAT_VERSION} has {', '.join(sorted(known))})")
    for name in _required():
        if record.get(name) is None:
            raise MedclrError(f"{directory / METADATA_NAME}: required field {name!r} is missing")
    for f in _recorded():
        value, kinds = record.get(f.name), _kinds(f.name)
        if value is not None and not _fits(value, kinds):
            raise MedclrError(f"{directory / source.get(f.name, METADATA_NAME)}: field {f.name!r} is {value!r}, "
                              f"expected {' or '.join(k.__name__ for k in kinds)}")


def _resolve(path: str, directory: Path) -> str:
    # A relative path that does not exist from here is taken relative to the checkpoint.
    p = Path(path).expanduser()
    return str(p if p.is_absolute() or p.exists() else directory / p)


# --------------------------------------------------------------------------- version 0: the side files

_SIDE_FILES = ("preprocess.json", "config.json", "train_config.yaml", "train_config.json", "config.yaml",
               "trainer_state.json")
_STATE = ("trainer_state.json",)
# field -> groups of (files, dotted keys), tried in order; within a group file by file, first key that hits.
_LEGACY: dict[str, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]] = {
    "image_size": ((_SIDE_FILES, ("image_size", "preprocess.image_size", "image.image_size", "data.image_size",
                                  "data.crop_size", "model.image_size", "training.data.image_size")),
                   (("train_config.yaml",), ("data.crop",))),
    "resize": ((_SIDE_FILES, ("resize", "preprocess.resize", "image.resize", "data.resize", "training.data.resize")),),
    "tau": ((_SIDE_FILES, ("tau", "loss.tau", "training.loss.tau", "inference.tau")),),
    "eta_table": ((_SIDE_FILES, ("eta_table", "data.eta", "data.eta_table", "training.data.eta",
                                 "inference.eta_table")),),
    "manifest": ((_SIDE_FILES, ("data.manifest", "manifest", "training.data.manifest")),),
    **{name: ((_STATE, (name,)),) for name in ("loss", "n_train", "global_batch", "step", "total_steps", "last_loss")},
}


def _from_side_files(directory: Path) -> tuple[dict[str, Any], dict[str, str]]:
    docs = {name: _read_structured(directory / name) for name in _SIDE_FILES if (directory / name).is_file()}
    record: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, groups in _LEGACY.items():
        hit = _first_hit(docs, groups)
        if hit is not None:
            record[name], source[name] = hit
    if record.get("tau") is None and (tau := _loss_state_tau(directory / LOSS_STATE_NAME)) is not None:
        record["tau"], source["tau"] = tau, LOSS_STATE_NAME
    if record.get("image_size") is None:
        record["image_size"], source["image_size"] = DEFAULT_IMAGE_SIZE, "medclr.inference default"
    return record, source


def _first_hit(docs: Mapping[str, Any], groups) -> tuple[Any, str] | None:
    for files, keys in groups:
        for name in files:
            for key in keys if name in docs else ():
                value = _lookup(docs[name], key)
                if value not in (None, "") and not isinstance(value, (dict, list)):
                    return value, name
    return None


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return None
        data = data[part]
    return data


def _read_structured(path: Path) -> dict[str, Any]:
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(path.read_text())
        else:
            data = json.loads(path.read_text())
    except Exception as exc:  # noqa: BLE001 - a broken old side file must not stop loading the model
        log.warning("checkpoint file %s is unreadable (%s); ignored", path, type(exc).__name__)
        return {}
    return data if isinstance(data, dict) else {}


def _loss_state_tau(path: Path) -> float | None:
    """A ``tau`` / ``log_tau`` / ``logit_scale`` tensor (any prefix) in the loss state, as tau."""
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
    except Exception:  # noqa: BLE001 - an unreadable loss state means "not recorded", as before
        return None
    return None
