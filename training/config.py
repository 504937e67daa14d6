"""Training configs: YAML files with `extends`, presets, key=value overrides, and a schema check.

Resolution order (later wins):  base.yaml < preset_<preset>.yaml < method.yaml (and whatever it
extends, minus base) < command-line overrides. ``configs/base.yaml`` is the schema: a key it
does not list is an error (with a suggestion), except inside ``loss:``, whose keys are the
chosen loss's constructor arguments: their names are checked here against its signature, their
values by the loss itself (``medclr.losses.build_loss``, in ``training.loop.preflight``).

Everything here is cheap (no torch), so a bad config fails with one line before any work.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import logging
import math
import os
from pathlib import Path
from typing import Any

import yaml

from medclr.errors import MedclrError
from medclr.presets import AUTO, auto_preset
from medclr.training.schema import check_types, parse_value

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
ROOT_CONFIG = "base"
# Keys of the `loss:` section that the trainer consumes itself; the rest go to build_loss.
TRAINER_LOSS_KEYS = ("name", "eta_source", "zeta_key")
ZETA_KEYS = ("sentence", "study")
ETA_SOURCES = ("none", "lm", "true", "rho_sent", "study_prior")


def available_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if not p.stem.startswith("preset_"))


def find_config(name: str | os.PathLike, relative_to: Path | None = None) -> Path:
    """A config by path, or by name in training/configs (``dcl_lm`` -> configs/dcl_lm.yaml)."""
    raw = str(name)
    candidates = [Path(raw).expanduser()]
    if relative_to is not None:
        candidates.append(relative_to / raw)
        candidates.append(relative_to / f"{raw}.yaml")
    candidates.append(CONFIG_DIR / f"{raw}.yaml")
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise MedclrError(f"config {raw!r}: no such file, and not a config name (names: {', '.join(available_configs())})")


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MedclrError(f"config {str(path)!r}: cannot be read as YAML ({first})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MedclrError(f"config {str(path)!r}: expected a mapping of keys at the top level")
    return data


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[Path, dict]]:
    """[(path, mapping)] from the root of the `extends` chain down to `path` (depth first)."""
    if path in chain:
        raise MedclrError(f"config {str(path)!r}: `extends` loops back to itself")
    data = _read_yaml(path)
    parents = data.pop("extends", None)
    parents = [] if parents is None else ([parents] if isinstance(parents, str) else list(parents))
    out: list[tuple[Path, dict]] = []
    for p in parents:
        for layer in _layers(find_config(p, path.parent), chain + (path,)):
            if layer[0] not in [q for q, _ in out]:
                out.append(layer)
    out.append((path, data))
    return out


def parse_overrides(items: list[str] | None) -> dict:
    """['optim.lr=1e-4', 'out=runs/a'] -> {'optim': {'lr': 0.0001}, 'out': 'runs/a'}."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise MedclrError(f"override {item!r}: expected key=value, e.g. optim.lr=1e-4 or out=runs/a")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise MedclrError(f"override {item!r}: {part!r} is set twice as a value and a section")
        node[parts[-1]] = parse_value(value)
    return out


def _suggest(key: str, known: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {prefix + close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def _coerce(value: Any, default: Any, where: str) -> Any:
    """Give `value` the type of its schema default where that is unambiguous."""
    if value is None or default is None or isinstance(default, str) or value == "auto":
        return value
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
            return value.lower() in ("true", "yes", "on")
        if not isinstance(value, bool):
            raise MedclrError(f"config {where}: expected true or false, got {value!r}")
        return value
    if isinstance(default, (int, float)):
        if isinstance(value, str):
            value = parse_value(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise MedclrError(f"config {where}: expected a number, got {value!r}")
        if isinstance(default, int) and not isinstance(default, bool):
            if float(value) != int(value):
                raise MedclrError(f"config {where}: expected a whole number, got {value!r}")
            return int(value)
        return float(value)
    if isinstance(default, list) and not isinstance(value, list):
        raise MedclrError(f"config {where}: expected a list like {default!r}, got {value!r}")
    return value


def _check_keys(cfg: dict, schema: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in cfg.items():
        where = f"{prefix}{key}"
        if key not in schema:
            raise MedclrError(f"config key {where!r} is unknown{_suggest(str(key), list(schema), prefix)}")
        default = schema[key]
        if isinstance(default, dict) and where != "loss":
            if not isinstance(value, dict):
                raise MedclrError(f"config {where}: expected a section of keys, got {value!r}")
            out[key] = _check_keys(value, default, where + ".")
        else:
            out[key] = _coerce(value, default, where)
    return out


def load_config(config: str | os.PathLike, overrides: list[str] | None = None) -> dict:
    """Resolve a config name/path plus overrides into one validated dict (no file outside configs is read)."""
    path = find_config(config)
    layers = _layers(path)
    root = find_config(ROOT_CONFIG)
    schema = _read_yaml(root)
    schema.pop("extends", None)
    over = parse_overrides(overrides)
    merged_method: dict = {}
    for p, data in layers:
        if p != root:
            merged_method = deep_merge(merged_method, data)
    preset = over.get("preset", merged_method.get("preset", schema.get("preset")))
    preset = "none" if preset is None else str(preset)
    if preset == AUTO:  # the recipe for the device training will run on, said in the log
        device = over.get("train", {}).get("device", merged_method.get("train", {}).get("device", "auto"))
        preset = auto_preset(device)
        log.info("preset auto: %s (train.device %s)", preset, device)
    preset_path = CONFIG_DIR / f"preset_{preset}.yaml"
    if not preset_path.is_file():
        names = sorted(p.stem[len("preset_"):] for p in CONFIG_DIR.glob("preset_*.yaml"))
        raise MedclrError(f"config preset {preset!r}: unknown (presets: {', '.join(names)})")
    cfg = schema
    for _, data in _layers(preset_path):  # a preset may extend another (gpu_small extends cpu_small)
        cfg = deep_merge(cfg, data)
    cfg = deep_merge(cfg, merged_method)
    cfg = deep_merge(cfg, over)
    cfg = _check_keys(cfg, schema)
    cfg["preset"] = preset
    cfg["config_path"] = str(path)
    return validate(cfg)


def validate(cfg: dict) -> dict:
    """Cheap semantic checks: required keys, every key's type and range (``medclr.training.schema``), what keys
    must agree on, loss name and arguments."""
    if not cfg.get("out"):
        raise MedclrError("config out: not set; pass out=DIR (the run's output / checkpoint directory)")
    if not cfg["data"].get("manifest"):
        raise MedclrError("config data.manifest: not set; pass data.manifest=PATH (from `medclr prepare`)")
    check_types(cfg)
    if cfg["data"]["crop"] > cfg["data"]["resize"]:
        raise MedclrError(f"config data.crop {cfg['data']['crop']} is larger than data.resize {cfg['data']['resize']}")
    from medclr.training.data import cache_mode

    cfg["data"]["cache"] = cache_mode(cfg["data"]["cache"])
    from medclr.training.augment import check_place

    check_place(cfg["data"]["augment_on"])
    dev = str(cfg["train"]["device"])
    if not (dev in ("auto", "cpu") or dev.startswith("cuda")):
        raise MedclrError(f"config train.device {dev!r}: expected auto, cpu or cuda")
    m = cfg["model"]
    if m["image_weights"] is not None and not Path(str(m["image_weights"])).expanduser().is_file():
        raise MedclrError(f"config model.image_weights {m['image_weights']!r}: no such file")
    if m["init"] is not None and not (Path(str(m["init"])).expanduser() / "model.safetensors").is_file():
        raise MedclrError(f"config model.init {m['init']!r}: no model.safetensors there (expected a `medclr train` "
                          "output dir or one of its checkpoints/step-N dirs)")
    if m["image_pretrained"] == "biovil" and m["image_weights"] is None:
        raise MedclrError("config model.image_pretrained=biovil needs model.image_weights=FILE (hi-ml-multimodal's "
                          "BioViL or BioViL-T image model .pt)")
    if cfg["model"]["output_stride"] not in (8, 16, 32) or cfg["model"]["output_stride"] > 2 ** (cfg["model"]["stages"] + 1):
        raise MedclrError(f"config model.output_stride {cfg['model']['output_stride']!r}: expected 32, 16 or 8 "
                          f"(at most {2 ** (cfg['model']['stages'] + 1)} with model.stages={cfg['model']['stages']})")
    if cfg["train"]["epochs"] is None and cfg["train"]["max_steps"] is None:
        raise MedclrError("config train: set train.epochs or train.max_steps")
    from medclr.data.hard_negatives import KINDS

    kinds = cfg["hard_negatives"]["kinds"]
    if not isinstance(kinds, list) or not set(kinds) <= set(KINDS):
        raise MedclrError(f"config hard_negatives.kinds {kinds!r}: expected a list of {', '.join(KINDS)}")
    from medclr.lm.eta import DEFAULT_ETA_MAX, check_eta_override

    d = cfg["data"]
    if d["eta_max"] is None:
        d["eta_max"] = DEFAULT_ETA_MAX
    try:
        check_eta_override(d["eta_a"], d["eta_k"], float(d["eta_max"]))
    except (MedclrError, TypeError, ValueError) as exc:
        raise MedclrError(f"config data.eta_a / eta_k / eta_max: {exc}") from None
    _validate_loss(cfg)
    return cfg


def loss_kwargs(cfg: dict) -> dict:
    """The `loss:` keys that go to build_loss (the trainer's own keys removed)."""
    return {k: v for k, v in cfg["loss"].items() if k not in TRAINER_LOSS_KEYS}


def _validate_loss(cfg: dict) -> None:
    from medclr.losses import LOSSES  # the registry; importing it is cheap next to a training run

    loss = cfg["loss"]
    name = str(loss.get("name", "")).strip().lower()
    if name not in LOSSES:
        raise MedclrError(f"config loss.name {loss.get('name')!r}: unknown loss; expected one of {', '.join(LOSSES)}")
    loss["name"] = name
    src = loss.get("eta_source", "none")
    src = "true" if src is True else ("none" if src in (None, False) else str(src).lower())
    if src not in ETA_SOURCES:
        raise MedclrError(f"config loss.eta_source {loss.get('eta_source')!r}: expected one of {', '.join(ETA_SOURCES)}")
    loss["eta_source"] = src
    zkey = str(loss.get("zeta_key", "sentence")).lower()
    if zkey not in ZETA_KEYS:
        raise MedclrError(f"config loss.zeta_key {loss.get('zeta_key')!r}: expected one of {', '.join(ZETA_KEYS)}")
    loss["zeta_key"] = zkey
    if name == "dcl_lm" and src == "none":
        raise MedclrError("config loss: dcl_lm needs per-pair eta; set loss.eta_source=lm (eta table), true "
                              "(phantom: DCL's false-negative rate of the sentence shown), rho_sent or study_prior (phantom)")
    if src == "lm":
        eta = cfg["data"].get("eta")
        if not eta:
            raise MedclrError(f"config data.eta: loss {name} with eta_source=lm needs an eta table; "
                              "run `medclr lm score` and pass data.eta=PATH/eta.parquet")
        if not Path(eta).expanduser().is_file():
            raise MedclrError(f"config data.eta {str(eta)!r}: eta table not found (make it with `medclr lm score`)")
    # Constructor arguments: names are checked here, values by the loss itself when it is built.
    params = inspect.signature(LOSSES[name].__init__).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = [k for k in params if k not in ("self", "num_samples")]
    for key in loss_kwargs(cfg):
        if not accepts_any and key not in known:
            raise MedclrError(f"config loss.{key}: not an argument of loss {name}{_suggest(key, known, 'loss.')}")


def needs_num_samples(name: str) -> bool:
    from medclr.losses import LOSSES

    return "num_samples" in inspect.signature(LOSSES[name].__init__).parameters


def takes_num_texts(name: str) -> bool:
    """Whether the loss keeps per-text tables that can be keyed by sentence (NUCLR's zeta_txt)."""
    from medclr.losses import LOSSES

    return "num_texts" in inspect.signature(LOSSES[name].__init__).parameters


def dump_yaml(cfg: dict) -> str:
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)
