"""The type and range of every key of ``configs/base.yaml``, as tables: :data:`NUMBERS`, :data:`CHOICES`,
:data:`PATHS` and :data:`NAMES`. :func:`check_types` checks a resolved config against them (``training.config``'s
``validate`` calls it when a config is read, before anything is built): a bad value is one line naming the key,
the value and what it takes. A new key of base.yaml gets a row here. The `loss:` section's values are checked by
the loss itself (``medclr.losses.build_loss``); data.eta_a / eta_k / eta_max by their owner, ``medclr.lm.eta``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from medclr.errors import MedclrError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def parse_value(text: str) -> Any:
    """A value as written on the command line (or a YAML string): YAML 1.1 reads "1e-4" as a string, so numbers are
    tried first and lr=1e-4 works."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


@dataclass(frozen=True)
class Number:
    """What a numeric key accepts: a number (``whole``: a whole one) within ``lo`` / ``hi`` (closed unless
    ``open_lo`` / ``open_hi``), or null (``null``), or ``auto`` (``auto``); with ``items`` a list of that many
    such numbers (``ordered``: none above the next). ``what`` names the number in the message when the bounds
    alone say less (a probability)."""

    whole: bool = False
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False
    null: bool = False
    auto: bool = False
    items: int = 0
    ordered: bool = False
    what: str = ""

    def fits(self, x: Any) -> bool:
        return (not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)
                and (not self.whole or float(x) == int(x))
                and (self.lo is None or (x > self.lo if self.open_lo else x >= self.lo))
                and (self.hi is None or (x < self.hi if self.open_hi else x <= self.hi)))

    def describe(self) -> str:
        noun = self.what or ("a whole number" if self.whole else "a number")
        lo, hi = (None if b is None else str(int(b)) if float(b).is_integer() else f"{b:g}" for b in (self.lo, self.hi))
        if lo is not None and hi is not None:
            bounds = f" in {'(' if self.open_lo else '['}{lo}, {hi}{')' if self.open_hi else ']'}"
        elif lo is not None:
            bounds = f" {'>' if self.open_lo else '>='} {lo}"
        elif hi is not None:
            bounds = f" {'<' if self.open_hi else '<='} {hi}"
        else:
            bounds = ""
        text = noun + bounds
        if self.items:
            text = f"a list of {self.items} numbers, each {text.removeprefix('a ')}" + (
                ", the first <= the second" if self.ordered else "")
        return ("auto or " if self.auto else "") + text + (" or null" if self.null else "")


# Every numeric key of configs/base.yaml outside `loss:` (data.eta_a / eta_k / eta_max: medclr.lm.eta).
NUMBERS: dict[str, Number] = {
    "seed": Number(whole=True, lo=0, hi=2**32 - 1),
    "data.other_sentence_weight": Number(lo=0, hi=1, open_lo=True),
    "data.short_form": Number(lo=0, hi=1, what="a probability"),
    "data.study_balance": Number(lo=0, hi=1),
    "data.resize": Number(whole=True, lo=1),
    "data.crop": Number(whole=True, lo=1),
    "data.cache_workers": Number(whole=True, lo=0),
    "data.num_workers": Number(whole=True, lo=0, auto=True),
    "data.aug.prob": Number(lo=0, hi=1, what="a probability"),
    "data.aug.brightness": Number(lo=0),
    "data.aug.contrast": Number(lo=0, hi=1, open_hi=True),  # intensities scale by a factor in [1 - c, 1 + c]
    "data.aug.gamma": Number(lo=0, open_lo=True, items=2, ordered=True),
    "model.joint_dim": Number(whole=True, lo=1),
    "model.lse_gamma": Number(lo=0, open_lo=True),
    "model.max_length": Number(whole=True, lo=1),
    "model.text_buckets": Number(whole=True, lo=1, auto=True),
    "hard_negatives.weight": Number(lo=0),
    "hard_negatives.tau": Number(lo=0, open_lo=True),
    "optim.lr": Number(lo=0),  # 0: a run that keeps its start (model.init's weights; tests/test_training.py)
    "optim.lr_text": Number(lo=0, null=True),
    "optim.weight_decay": Number(lo=0),
    "optim.betas": Number(lo=0, hi=1, open_hi=True, items=2),
    "optim.eps": Number(lo=0, open_lo=True),
    "optim.warmup_steps": Number(whole=True, lo=0),
    "optim.min_lr_ratio": Number(lo=0, hi=1),
    "optim.grad_clip": Number(lo=0),
    "train.batch_size": Number(whole=True, lo=1),
    "train.epochs": Number(lo=0, open_lo=True, null=True),
    # 0 only for a checkpoint of weights trained elsewhere (see _check_no_steps)
    "train.max_steps": Number(whole=True, lo=0, null=True),
    "train.max_minutes": Number(lo=0, open_lo=True, null=True),
    "log.every": Number(whole=True, lo=1),
    "ckpt.every": Number(whole=True, lo=1),
    "ckpt.keep_last": Number(whole=True, lo=1),
    "val.every": Number(whole=True, lo=0, null=True),
    "val.max_images": Number(whole=True, lo=0),
}
# Keys that take one of a few values (the first is not necessarily the default).
CHOICES: dict[str, tuple[Any, ...]] = {
    "data.cache_dtype": ("uint8", "float16", "float32"),
    "data.sentence_sampling": ("uniform", "findings"),
    "data.study_sampling": ("uniform", "findings"),
    "model.head": ("cosine", "lse_nl"),
    "model.image_pretrained": ("auto", "imagenet", "none", "biovil"),
    "model.input_norm": ("auto", "imagenet", "none"),
    "model.projector": ("linear", "mlp"),
    "model.pooling": ("mean", "cls"),
    "model.stages": (4, 3),
    "model.channels_last": ("auto", True, False),
    "train.precision": PRECISIONS,
    "log.progress": ("auto", True, False),
    "val.prompts": ("paper", "report"),  # medclr.prompts.BUILTIN_PROMPTS
}
# Keys that name a file or folder (or a hub id: model.text), null where base.yaml allows it.
PATHS = ("out", "data.manifest", "data.eta", "data.cache_dir", "model.text", "model.image_weights", "model.init")
# Keys that take a name.
NAMES = ("data.split", "data.val_split", "model.arch")


def _get(cfg: dict, dotted: str) -> tuple[dict, str]:
    """(the section that holds a dotted key, its last part)."""
    *sections, key = dotted.split(".")
    for part in sections:
        cfg = cfg[part]
    return cfg, key


def _shown(value: Any) -> str:
    return {True: "true", False: "false"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _check_number(cfg: dict, dotted: str, rule: Number) -> None:
    sec, key = _get(cfg, dotted)
    value = sec[key]
    if value is None and rule.null or value == "auto" and rule.auto:
        return
    parsed = parse_value(value) if isinstance(value, str) else value  # a YAML file's 1e-4 is a string
    values = parsed if rule.items and isinstance(parsed, list) else [parsed]
    if (rule.items and (not isinstance(parsed, list) or len(parsed) != rule.items)) or not all(map(rule.fits, values)) \
            or (rule.ordered and values != sorted(values)):
        raise MedclrError(f"config {dotted} {value!r}: expected {rule.describe()}")
    values = [int(v) if rule.whole else float(v) for v in values]
    sec[key] = values if rule.items else values[0]


def _check_no_steps(cfg: dict) -> None:
    """train.max_steps=0 writes the model as built: a checkpoint of weights trained elsewhere (BioViL as published,
    model.init's), never an untrained one that `medclr score` and the app would serve."""
    m = cfg["model"]
    if cfg["train"]["max_steps"] == 0 and m["image_pretrained"] != "biovil" and m["init"] is None:
        raise MedclrError("config train.max_steps 0: a run of no steps writes the model untrained; expected a whole "
                          "number >= 1 (0 only saves weights trained elsewhere: model.image_pretrained=biovil or "
                          "model.init=DIR)")


def check_types(cfg: dict) -> None:
    """Every typed key of base.yaml, from the tables above: one line naming the key, the value and what it takes."""
    for dotted, rule in NUMBERS.items():
        _check_number(cfg, dotted, rule)
    for dotted, choices in CHOICES.items():
        sec, key = _get(cfg, dotted)
        if not any(sec[key] == c and isinstance(sec[key], bool) == isinstance(c, bool) for c in choices):  # 1 is no true
            names = [_shown(c) for c in choices]
            raise MedclrError(f"config {dotted} {sec[key]!r}: expected {', '.join(names[:-1])} or {names[-1]}")
    for dotted in PATHS + NAMES:
        sec, key = _get(cfg, dotted)
        value = sec[key]
        if isinstance(value, int) and not isinstance(value, bool):
            sec[key] = value = str(value)  # out=2024 is a folder's name
        if not (value is None and dotted in PATHS or isinstance(value, str) and value.strip()):
            kind = "a path" + (" or a hub id" if dotted == "model.text" else "") if dotted in PATHS else "a name"
            raise MedclrError(f"config {dotted} {value!r}: expected {kind}")
    _check_no_steps(cfg)
