"""Checkpoints: written atomically, keep-last-k, exact resume; OUT itself is always a loadable model.

Layout (docs/training.md, "Checkpoints and resume")::

    OUT/checkpoints/step-0000500/   config.json  model.safetensors  tokenizer/   (DualEncoder.save_pretrained)
                                    prompt_embeddings.safetensors   the CheX5 prompts encoded (medclr.inference.stored_prompts)
                                    loss_state.safetensors   every loss buffer/parameter (u, zeta, step, ...)
                                    optimizer.pt             optimizer + scheduler + grad-scaler state dicts
                                    trainer_state.json       step, epoch, sampler position, config, data fingerprint
                                    rng_rank{r}.pt           torch / CUDA / numpy / python RNG of rank r (tensors)
                                    checkpoint_meta.json     what readers need: crop, resize, tau, loss, eta table,
                                                             data, step (medclr.inference.metadata)
                                    train_config.yaml
    OUT/  config.json  model.safetensors  loss_state.safetensors  tokenizer/  checkpoint_meta.json  prompt_embeddings.safetensors
          train_config.yaml  trainer_state.json
          (the latest checkpoint's model files: `DualEncoder.from_pretrained(OUT)` works; eval/app/index load OUT)

Atomicity: a step directory is assembled under ``checkpoints/.tmp-step-N`` and renamed into place
(a rename of a directory is atomic on POSIX), so any ``step-*`` directory is complete; files in
OUT are replaced one by one with ``os.replace``. Everything .pt is plain tensors/containers and is
read back with ``torch.load(weights_only=True)``; nothing is unpickled from objects.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.files import stable_safetensors
from medclr.inference.checkpoint import (  # not in the loss's state_dict
    SAMPLE_INDEX_KEY,
    TEXT_HASH_KEY,
    hash_to_int,
    weights_sha256,
)
from medclr.inference.metadata import METADATA_NAME, CheckpointMeta, write_metadata
from medclr.inference.stored_prompts import PROMPTS_NAME, save_prompt_embeddings
from medclr.prompts import checkpoint_prompts

CKPT_DIR = "checkpoints"
_STEP_RE = re.compile(r"^step-(\d{7,})$")
PUBLISHED = ("config.json", "model.safetensors", "loss_state.safetensors", METADATA_NAME, "train_config.yaml",
             "trainer_state.json", PROMPTS_NAME)


def step_dir(out: Path, step: int) -> Path:
    return Path(out) / CKPT_DIR / f"step-{step:07d}"


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    root = Path(out) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    ckpts = [p for _, p in list_checkpoints(out) if (p / "trainer_state.json").is_file()]
    return ckpts[-1] if ckpts else None


def resolve_resume(arg: str, out: Path) -> Path:
    """--resume (auto = latest under OUT/checkpoints) or an explicit step directory."""
    if arg in ("auto", "", None):
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            raise MedclrError(f"--resume: no checkpoint under {Path(out) / CKPT_DIR} (nothing to resume)")
        return ckpt
    p = Path(arg).expanduser()
    if (p / "trainer_state.json").is_file() and (p / "optimizer.pt").is_file():
        return p
    ckpt = latest_checkpoint(p) if p.is_dir() else None
    if ckpt is None:
        raise MedclrError(f"--resume {arg}: not a checkpoint directory (expected trainer_state.json and optimizer.pt)")
    return ckpt


def read_trainer_state(ckpt: Path) -> dict:
    try:
        return json.loads((Path(ckpt) / "trainer_state.json").read_text())
    except (OSError, ValueError) as exc:
        raise MedclrError(f"checkpoint {str(ckpt)!r}: unreadable trainer_state.json ({exc})") from None


# --------------------------------------------------------------------------- RNG states


def rng_state() -> dict[str, Any]:
    """Every RNG the model side uses (dropout, ...), as tensors (loadable with weights_only=True)."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        "numpy_pos": torch.tensor([np_pos, np_has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([np_gauss], dtype=torch.float64),
        "python_state": torch.tensor(py_state, dtype=torch.int64),
        "python_version": torch.tensor([py_version], dtype=torch.int64),
        "python_gauss": torch.tensor([float("nan") if py_gauss is None else py_gauss], dtype=torch.float64),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    pos, has_gauss = (int(v) for v in state["numpy_pos"])
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss,
                         float(state["numpy_gauss"][0])))
    gauss = float(state["python_gauss"][0])
    random.setstate((int(state["python_version"][0]), tuple(int(v) for v in state["python_state"]),
                     None if np.isnan(gauss) else gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


# --------------------------------------------------------------------------- writing


def _fsync_tree(path: Path) -> None:
    # Durability against power loss, not only SIGKILL: flush file contents before the rename.
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_loss_state(loss: torch.nn.Module, path: Path, meta: dict[str, str],
                    sample_index: np.ndarray | None = None, texts: list[str] | None = None) -> None:
    from safetensors.torch import save_file

    from medclr.data.text import sentence_hash

    tensors = {k: v.detach().cpu().contiguous() for k, v in loss.state_dict().items()}
    if sample_index is not None:
        tensors[SAMPLE_INDEX_KEY] = torch.tensor(np.asarray(sample_index, dtype=np.int64))  # a copy: the table may be read-only
    if texts is not None and getattr(loss, "num_texts", None) is not None:
        tensors[TEXT_HASH_KEY] = torch.tensor([hash_to_int(sentence_hash(t)) for t in texts], dtype=torch.int64)
    save_file(tensors, str(path), metadata={k: str(v) for k, v in meta.items()})
    stable_safetensors(path)  # the same state: the same bytes, whatever the process


def load_loss_state(loss: torch.nn.Module, path: Path, texts: list[str] | None = None) -> None:
    """Restore the loss's buffers; with ``texts`` (the run's distinct training sentences) a sentence-keyed
    table must have been saved for exactly those sentences, in that order."""
    from safetensors.torch import load_file

    from medclr.data.text import sentence_hash

    state = load_file(str(path))
    state.pop(SAMPLE_INDEX_KEY, None)
    saved_texts = state.pop(TEXT_HASH_KEY, None)
    if texts is not None and getattr(loss, "num_texts", None) is not None:
        want = torch.tensor([hash_to_int(sentence_hash(t)) for t in texts], dtype=torch.int64)
        if saved_texts is None or not torch.equal(saved_texts, want):
            raise MedclrError(f"checkpoint loss state {str(path)!r}: its text table is not keyed by this run's "
                              "training sentences (trained with loss.zeta_key=study, or the reports changed); "
                              "resume with loss.zeta_key=study, or start a new run")
    own = loss.state_dict()
    bad = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if bad or set(own) != set(state):
        detail = (f"{bad[0]} has shape {tuple(state[bad[0]].shape)} vs {tuple(own[bad[0]].shape)} here" if bad
                  else f"tensors {sorted(set(own) ^ set(state))[:3]} differ")
        raise MedclrError(f"checkpoint loss state {str(path)!r} does not fit this loss ({detail}): "
                          "was it trained with another loss or data set?")
    device = next(iter(own.values())).device if own else torch.device("cpu")
    loss.load_state_dict({k: v.to(device) for k, v in state.items()}, strict=True)


def _prune(out: Path, keep_last: int) -> None:
    for _, p in list_checkpoints(out)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


def _publish(ckpt: Path, out: Path) -> None:
    """Make OUT hold the latest model files (hard links when possible: no second copy on disk)."""
    for name in PUBLISHED:
        src = ckpt / name
        if not src.is_file():
            continue
        tmp = out / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)
        os.replace(tmp, out / name)
    tok = ckpt / "tokenizer"
    if tok.is_dir():
        tmp, old = out / ".tokenizer.tmp", out / ".tokenizer.old"
        for p in (tmp, old):
            shutil.rmtree(p, ignore_errors=True)
        shutil.copytree(tok, tmp)
        if (out / "tokenizer").exists():
            os.replace(out / "tokenizer", old)
        os.replace(tmp, out / "tokenizer")
        shutil.rmtree(old, ignore_errors=True)


def space_needed(out: Path, model: torch.nn.Module, loss: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 keep_last: int) -> int:
    """Bytes the run's checkpoints will still add under OUT, roughly: a step folder holds the model's weights, the
    loss's state and AdamW's two moments per trained parameter (state the optimizer has not allocated yet), and
    keep_last + 1 of them exist at once (the newest is written before the oldest is pruned; OUT's copy of the
    model is hard links). Folders already there count as written."""
    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    moments = 2 * nbytes(p for group in optimizer.param_groups for p in group["params"])
    step = nbytes(model.state_dict().values()) + nbytes(loss.state_dict().values()) + moments
    return max(1, keep_last + 1 - len(list_checkpoints(out))) * step


def clean_stale(out: Path) -> None:
    """Remove half-written checkpoint directories left by a killed run."""
    root = Path(out) / CKPT_DIR
    if root.is_dir():
        for p in root.glob(".tmp-step-*"):
            shutil.rmtree(p, ignore_errors=True)


def checkpoint_meta(trainer_state: dict, loss: torch.nn.Module, weights_sha256: str | None = None) -> CheckpointMeta:
    """What readers of the checkpoint need, from the trainer state (and its config), the loss and the SHA-256 of
    the weights file just written (readers verify it)."""
    cfg, st = trainer_state["config"], trainer_state
    tau = getattr(loss, "tau", None)  # the value the loss trained with, also when the config left the default
    return CheckpointMeta(
        image_size=int(cfg["data"]["crop"]), resize=int(cfg["data"]["resize"]),  # the eval-time centre crop
        tau=float(tau) if isinstance(tau, (int, float)) else None, loss=cfg["loss"]["name"],
        eta_source=cfg["loss"].get("eta_source"), eta_table=_absolute(cfg["data"].get("eta")),
        manifest=_absolute(cfg["data"]["manifest"]), split=cfg["data"]["split"], data_fingerprint=st["fingerprint"],
        n_train=st["n_train"], global_batch=st["global_batch"], step=st["step"], total_steps=st["total_steps"],
        last_loss=st["last_loss"], findings=st.get("findings"), eta_override=_eta_override(cfg),
        weights_sha256=weights_sha256)


def _eta_override(cfg: dict) -> dict | None:
    """The a, k, eta_max training recomputed eta with (data.eta_a / eta_k), for readers of the eta table."""
    d = cfg["data"]
    if cfg["loss"].get("eta_source") != "lm" or d.get("eta_a") is None:
        return None
    return {"a": float(d["eta_a"]), "k": float(d["eta_k"]), "eta_max": float(d["eta_max"])}


def _absolute(path: str | None) -> str | None:
    return str(Path(path).expanduser().resolve()) if path else None


def save_checkpoint(*, out: Path, step: int, model, loss, optimizer, scheduler, scaler, trainer_state: dict,
                    config_yaml: str, env, keep_last: int, barrier,
                    sample_index: np.ndarray | None = None, texts: list[str] | None = None) -> Path:
    """Collective: every rank calls it (each writes its own RNG state); rank 0 writes the rest."""
    out = Path(out)
    tmp = out / CKPT_DIR / f".tmp-step-{step:07d}"
    final = step_dir(out, step)
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    try:
        torch.save(rng_state(), tmp / f"rng_rank{env.rank}.pt")
        barrier()
        if env.is_main:
            model.save_pretrained(tmp)
            save_loss_state(loss, tmp / "loss_state.safetensors",
                            {"loss": trainer_state.get("loss", ""), "num_samples": trainer_state.get("n_train", "")},
                            sample_index, texts)
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict() if scaler is not None else None}, tmp / "optimizer.pt")
            sha = weights_sha256(tmp)
            # the prompts its readers will use (the findings record's), so scoring needs no text tower
            save_prompt_embeddings(tmp, model, sha, checkpoint_prompts(trainer_state.get("findings"))[1])
            write_metadata(tmp, checkpoint_meta(trainer_state, loss, sha))
            (tmp / "train_config.yaml").write_text(config_yaml)
            (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2, sort_keys=True, default=str))
            _fsync_tree(tmp)
            if final.exists():  # a re-run of the same step (resume from an earlier checkpoint)
                shutil.rmtree(final)
            os.replace(tmp, final)
            _prune(out, keep_last)
            _publish(final, out)
    except BaseException:
        if env.is_main:  # a save that failed (a full disk) leaves no half-written step behind
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    barrier()
    return final


def init_weights(model: torch.nn.Module, src: str | os.PathLike) -> str:
    """Fill ``model`` (built from this run's config) with the weights of the checkpoint ``src`` (``model.init``):
    every tensor, shapes equal, the file's SHA-256 the one its training recorded, the same word-piece vocabulary.
    Returns that SHA-256 (the run records where it started)."""
    from safetensors.torch import load_model

    from medclr.inference.metadata import read_metadata
    from medclr.models.hub import load_tokenizer

    src = Path(src).expanduser()
    meta = read_metadata(src)
    if meta.lacks_weights_sha256:
        raise MedclrError(f"config model.init {str(src)!r}: its checkpoint_meta.json has lost the SHA-256 of its weights, "
                          "which its format always records; start from an intact checkpoint")
    sha = weights_sha256(src)
    if meta.weights_sha256 and sha != meta.weights_sha256:
        raise MedclrError(f"config model.init {str(src)!r}: model.safetensors does not have the SHA-256 its training "
                          "recorded (damaged or changed)")
    try:
        missing, unexpected = load_model(model, str(src / "model.safetensors"), strict=False)
    except Exception as exc:  # safetensors raises its own types on a corrupt file or a shape mismatch
        raise MedclrError(f"config model.init {str(src)!r}: its weights do not fit this run's model "
                          f"({str(exc).splitlines()[0][:200]})") from None
    if missing or unexpected:
        raise MedclrError(f"config model.init {str(src)!r}: its weights do not match this run's model config "
                          f"({len(missing)} missing, {len(unexpected)} unexpected tensors); train with its config")
    theirs = load_tokenizer(src / "tokenizer", False).get_vocab() if (src / "tokenizer").is_dir() else None
    if theirs is not None and theirs != model.text_encoder.tokenizer.get_vocab():
        raise MedclrError(f"config model.init {str(src)!r}: its tokenizer differs from model.text's; start from the "
                          "text model it was trained with")
    return sha


def restore_checkpoint(ckpt: Path, *, model, loss, optimizer, scheduler, scaler, env, texts: list[str] | None = None) -> dict:
    """Restore everything saved by save_checkpoint into already-built objects; returns trainer_state."""
    from safetensors.torch import load_model

    ckpt = Path(ckpt)
    state = read_trainer_state(ckpt)
    try:
        missing, unexpected = load_model(model, str(ckpt / "model.safetensors"), strict=False, device=str(env.device))
    except Exception as exc:
        raise MedclrError(f"checkpoint {str(ckpt)!r}: model.safetensors cannot be read ({exc})") from None
    if missing or unexpected:
        raise MedclrError(f"checkpoint {str(ckpt)!r}: the model does not match this config "
                          f"({len(missing)} missing, {len(unexpected)} unexpected tensors)")
    load_loss_state(loss, ckpt / "loss_state.safetensors", texts)
    opt = torch.load(ckpt / "optimizer.pt", map_location=env.device, weights_only=True)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    if scaler is not None and opt.get("scaler") is not None:
        scaler.load_state_dict(opt["scaler"])
    rng_file = ckpt / f"rng_rank{env.rank}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True))
    state["rng_restored"] = rng_file.is_file()
    return state
