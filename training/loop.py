"""The training loop: pre-flight checks, model/loss/data/optimizer setup, steps, checkpoints, resume.

What the loss sees: with the cosine head, the image tower's global embedding and the text tower's
sentence embedding (B x D each, cast to float32; the loss's own all-gather makes the candidates
global under DDP). With model.head=lse_nl, the similarity blocks of the head (local images x all
sentences, local sentences x all images; score_blocks gathers the NL-contextualised region cells
and the sentence embeddings with gradient), so the head is trained with the towers, inside DDP and
the optimizer. Either way the losses' sum(local rows) * W / B reduction makes DDP's gradient
average the exact full-batch gradient, so no world-size factor appears here (docs/training.md).
With hard_negatives.weight > 0 the hard-negative term (medclr.losses.hard_negatives) is added,
scored through the same head and reduced the same way.

Exactness of resume rests on three things: data randomness is a function of (seed, epoch,
index) (training/data.py); the sampler position is the step (training/sampler.py); everything
else (model, optimizer, scheduler incl. a time-budget step count, scaler, loss tables, RNGs)
is in the checkpoint (training/checkpoint.py). The DataLoader gets its own torch.Generator so
creating an iterator never consumes the global RNG that dropout draws from.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from medclr.errors import MedclrError
from medclr.losses.distributed import score_blocks
from medclr.losses.hard_negatives import hard_negative_term
from medclr.training import checkpoint as ckpt_mod
from medclr.training.budget import StepBudget
from medclr.training.config import dump_yaml, loss_kwargs, needs_num_samples
from medclr.training.data import Collate, PairDataset, TrainTable, check_images_exist, load_table
from medclr.training.distributed import DistEnv, all_reduce_mean, average_grads, barrier, broadcast_object, cleanup, env_world, setup
from medclr.training.hooks import MetricsLogger, Validator
from medclr.training.optim import WarmupCosine, build_optimizer, param_groups, zeta_lr_at
from medclr.training.sampler import GlobalBatchSampler

log = logging.getLogger(__name__)


class TwoTower(nn.Module):
    """The part DDP wraps: images -> the head's image side, tokens -> sentence embeddings (the batch's
    sentences, then any hard negatives the collate appended; the loop splits them).

    Cosine head: the global embedding (the loss pairs embeddings, exactly as before heads were
    trained). Any other head (LSE+NL): ``head.image_side`` (NL-contextualised unit region cells), so
    the head's parameters are inside DDP and the optimizer; the loss then scores pairs through
    ``head.score`` on the gathered sides (``medclr.losses.distributed.score_blocks``)."""

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, head: nn.Module | None = None) -> None:
        super().__init__()
        self.image_encoder, self.text_encoder, self.head = image_encoder, text_encoder, head

    def forward(self, images: torch.Tensor, tokens: dict) -> tuple[torch.Tensor, torch.Tensor]:
        features, text = self.image_encoder(images), self.text_encoder(**tokens).embedding
        if self.head is None:
            return features.global_emb, text
        return self.head.image_side(features), text


@dataclass
class Plan:
    cfg: dict
    out: Path
    text_model: str
    table: TrainTable
    resume: Path | None
    resume_state: dict | None
    steps_per_epoch: int
    total_steps: int


def resolve_text_model(cfg: dict) -> str:
    text = cfg["model"]["text"]
    if text:
        p = Path(str(text)).expanduser()
        return str(p.resolve()) if p.exists() else str(text)  # else a cached hub id; the encoder checks
    default = Path(cfg["data"]["manifest"]).expanduser().resolve().parent / "lm"
    if (default / "config.json").is_file():
        return str(default)
    raise MedclrError(f"model.text is not set and {default} holds no language model: run `medclr lm fit` "
                      "or pass model.text=DIR (a Hugging Face BERT directory)")


def preflight(cfg: dict, resume: str | None, world_size: int) -> Plan:
    """Every check that can fail on bad input, before any model is built or image cached."""
    out = Path(cfg["out"]).expanduser().resolve()
    text_model = resolve_text_model(cfg)
    table = load_table(cfg)
    n, gb = len(table), int(cfg["train"]["batch_size"])
    if gb % world_size:
        raise MedclrError(f"train.batch_size {gb} (the global batch) is not divisible by the {world_size} processes")
    if n < gb:
        raise MedclrError(f"the {cfg['data']['split']} split has {n} usable pairs, fewer than train.batch_size {gb}")
    spe = n // gb
    total = int(cfg["train"]["max_steps"]) if cfg["train"]["max_steps"] is not None else \
        max(1, round(float(cfg["train"]["epochs"]) * spe))
    ckpt, state = None, None
    if resume is not None:
        ckpt = ckpt_mod.resolve_resume(resume, out)
        state = ckpt_mod.read_trainer_state(ckpt)
        if int(state.get("n_train", -1)) != n:
            raise MedclrError(f"--resume {ckpt}: dataset size mismatch: the checkpoint was trained on "
                              f"{state.get('n_train')} pairs, the {cfg['data']['split']} split now has {n}")
        if state.get("fingerprint") != table.fingerprint:
            raise MedclrError(f"--resume {ckpt}: the {cfg['data']['split']} rows differ from the ones the "
                              "checkpoint was trained on (same size, other images/reports)")
        if int(state.get("global_batch", -1)) != gb:
            raise MedclrError(f"--resume {ckpt}: train.batch_size {gb} differs from the checkpoint's "
                              f"{state.get('global_batch')} (the sampler position would not match)")
        if state.get("loss") != cfg["loss"]["name"]:
            raise MedclrError(f"--resume {ckpt}: loss {cfg['loss']['name']} differs from the checkpoint's {state.get('loss')}")
        total = int(state["total_steps"])
    elif ckpt_mod.latest_checkpoint(out) is not None:
        raise MedclrError(f"out {out} already holds a training run ({ckpt_mod.latest_checkpoint(out).name}); "
                          "pass --resume to continue it, or choose another out")
    check_images_exist(table, cfg["data"]["manifest"])
    return Plan(cfg, out, text_model, table, ckpt, state, spe, total)


def _amp(cfg: dict, device: torch.device):
    p = cfg["train"]["precision"]
    if p == "auto":
        p = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[p]


def _num_workers(cfg: dict, env: DistEnv) -> int:
    nw = cfg["data"]["num_workers"]
    if nw != "auto":
        return int(nw)
    if env.device.type != "cuda":
        return 0  # on a CPU the model needs every core; cached crops are cheap to make inline
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, min(8, (os.cpu_count() or 2) // local_world - 1))


def train(cfg: dict, resume: str | None = None) -> dict:
    """Run (or resume) one training; under torchrun every rank calls this. Returns a summary."""
    _, world, _ = env_world()
    plan = preflight(cfg, resume, world)
    env = setup(str(cfg["train"]["device"]), timeout_s=1800.0)
    try:
        return _run(plan, env)
    finally:
        cleanup()


def _build(plan: Plan, env: DistEnv):
    from medclr.losses import build_loss
    from medclr.models import build_dual_encoder

    cfg, m = plan.cfg, plan.cfg["model"]
    seed = int(cfg["seed"])
    torch.manual_seed(seed)  # identical initialisation on every rank
    channels_last = env.device.type == "cuda" if m["channels_last"] == "auto" else bool(m["channels_last"])
    head = m["head"] if m["head"] == "cosine" else {"type": m["head"], "gamma": float(m["lse_gamma"]),
                                                      "learn_gamma": bool(m["lse_learn_gamma"])}
    model = build_dual_encoder(plan.text_model, arch=m["arch"], joint_dim=int(m["joint_dim"]), head=head,
                               image_pretrained=m["image_pretrained"], projector=m["projector"],
                               channels_last=channels_last, pooling=m["pooling"], max_length=int(m["max_length"]),
                               output_stride=int(m["output_stride"]), stages=int(m["stages"]))
    if m["head"] != "cosine":
        model.head.trained = True  # the loss scores pairs through it (TwoTower, score_blocks)
    kwargs = loss_kwargs(cfg)
    if needs_num_samples(cfg["loss"]["name"]):
        kwargs["num_samples"] = len(plan.table)
    if "freeze_zeta_epochs" in cfg["loss"]:
        kwargs["freeze_zeta_steps"] = int(round(float(cfg["loss"]["freeze_zeta_epochs"]) * plan.steps_per_epoch))
        if kwargs["freeze_zeta_steps"] >= plan.total_steps and env.is_main:
            log.warning("loss.freeze_zeta_epochs=%s covers the whole run (%d steps): zeta is never updated "
                        "(short runs: pass loss.freeze_zeta_epochs=1 or 0)", cfg["loss"]["freeze_zeta_epochs"],
                        plan.total_steps)
    loss = build_loss(cfg["loss"]["name"], **kwargs)
    torch.manual_seed(seed + 7919 * env.rank)  # per-rank dropout streams from here on
    return model.to(env.device), loss.to(env.device)


def _run(plan: Plan, env: DistEnv) -> dict:
    cfg, out = plan.cfg, plan.out
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers fork after the tokenizer is used
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
        ckpt_mod.clean_stale(out)
    model, loss = _build(plan, env)
    head = None if model.head.kind == "cosine" else model.head
    tower = TwoTower(model.image_encoder, model.text_encoder, head)
    o = cfg["optim"]
    groups = param_groups(model, loss, [tower], float(o["lr"]), None if o["lr_text"] is None else float(o["lr_text"]),
                          float(o["weight_decay"]))
    optimizer = build_optimizer(groups, cfg, env.device)
    schedule = WarmupCosine(int(o["warmup_steps"]), plan.total_steps, float(o["min_lr_ratio"]))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    amp_dtype = _amp(cfg, env.device)
    scaler = torch.amp.GradScaler(env.device.type) if amp_dtype == torch.float16 else None

    ds = PairDataset(plan.table, cfg, cache_progress=env.is_main and cfg["log"]["progress"] is True)
    sampler = GlobalBatchSampler(len(ds), int(cfg["train"]["batch_size"]), env.rank, env.world_size, int(cfg["seed"]))
    step, state = 0, {"budget_fixed": cfg["train"]["max_minutes"] is None, "elapsed_s": 0.0}
    if plan.resume is not None:
        state = ckpt_mod.load_checkpoint(plan.resume, model=model, loss=loss, optimizer=optimizer,
                                         scheduler=scheduler, scaler=scaler, env=env)
        step = int(state["step"])
        if not state.get("rng_restored"):
            log.warning("resume: no RNG state for rank %d (world size changed?); dropout will differ", env.rank)
        if env.is_main:
            log.info("resumed from %s at step %d of %d", plan.resume, step, plan.total_steps)
    sampler.step = step
    total = plan.total_steps
    schedule.total = total

    runner: nn.Module = tower
    if env.enabled:
        runner = nn.parallel.DistributedDataParallel(
            tower, device_ids=[env.device.index] if env.device.type == "cuda" else None, gradient_as_bucket_view=True)
    if cfg["train"]["compile"]:
        runner = torch.compile(runner)
    nw = _num_workers(cfg, env)
    hard_weight, hard_tau = float(cfg["hard_negatives"]["weight"]), float(cfg["hard_negatives"]["tau"])
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, num_workers=nw, collate_fn=Collate(model.text_encoder),
        pin_memory=env.device.type == "cuda", persistent_workers=nw > 0, prefetch_factor=4 if nw else None,
        generator=torch.Generator().manual_seed(int(cfg["seed"])))

    metrics = MetricsLogger(out, cfg, env.is_main, step, total)
    validator = Validator(cfg, env.device, amp_dtype) if (cfg["val"]["every"] is not None and env.is_main) else None
    clip = float(o["grad_clip"] or 0.0)
    all_params = [p for g in optimizer.param_groups for p in g["params"]]
    loss_params = [p for p in loss.parameters() if p.requires_grad]
    zeta_sched = cfg["loss"].get("zeta_lr_schedule")
    zeta_base = (getattr(loss, "zeta_lr", None), getattr(loss, "zeta_lr_img", None))
    freeze = int(getattr(loss, "freeze_zeta_steps", 0))
    gb = int(cfg["train"]["batch_size"])
    model.train()
    loss.train()

    def trainer_state(last_loss: float | None) -> dict:
        epoch, k = sampler.position(step)
        return {"step": step, "epoch": epoch, "batch_in_epoch": k, "total_steps": total,
                "budget_fixed": state["budget_fixed"], "elapsed_s": elapsed(), "steps_per_epoch": plan.steps_per_epoch,
                "n_train": len(ds), "fingerprint": plan.table.fingerprint, "global_batch": gb,
                "world_size": env.world_size, "seed": int(cfg["seed"]), "loss": cfg["loss"]["name"],
                "manifest": str(cfg["data"]["manifest"]), "text_model": plan.text_model, "last_loss": last_loss,
                "torch": torch.__version__, "config": cfg}

    t_run = time.perf_counter()
    elapsed0 = float(state.get("elapsed_s", 0.0))

    def elapsed() -> float:
        return elapsed0 + time.perf_counter() - t_run

    def save(last_loss: float | None) -> None:
        ckpt_mod.save_checkpoint(out=out, step=step, model=model, loss=loss, optimizer=optimizer, scheduler=scheduler,
                                 scaler=scaler, trainer_state=trainer_state(last_loss), config_yaml=dump_yaml(cfg),
                                 env=env, keep_last=int(cfg["ckpt"]["keep_last"]), barrier=lambda: barrier(env),
                                 sample_index=plan.table.manifest_index)
        if env.is_main:
            print(f"checkpoint {ckpt_mod.step_dir(out, step)}", flush=True)

    def validate() -> dict:
        res = validator(model) if validator is not None else {}
        if res:
            metrics.write({"step": step, **res})
        barrier(env)
        return res

    start_step, last_loss, val_res = step, None, {}
    window = (time.perf_counter(), step)
    budget = None if state["budget_fixed"] else StepBudget(float(cfg["train"]["max_minutes"]) * 60.0, total)
    it = iter(loader)
    try:
        while step < total:
            batch = next(it)
            images = batch["images"].to(env.device, non_blocking=True)
            tokens = {k: v.to(env.device, non_blocking=True) for k, v in batch["tokens"].items()}
            index = batch["index"].to(env.device, non_blocking=True)
            eta = batch["eta"].to(env.device, non_blocking=True) if batch["eta"] is not None else None
            if zeta_sched and zeta_base[0] is not None:
                loss.zeta_lr = zeta_lr_at(step, zeta_base[0], freeze, total, zeta_sched)
                loss.zeta_lr_img = zeta_lr_at(step, zeta_base[1], freeze, total, zeta_sched)
            with torch.autocast(env.device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                img_side, txt_all = runner(images, tokens)
            # exps/logs in float32: the losses upcast and disable autocast themselves; be explicit anyway
            img_side, txt_emb = img_side.float(), txt_all[: images.shape[0]].float()
            if head is None:
                value = loss(img_side, txt_emb, index=index, eta=eta)
            else:
                value = loss(sims=score_blocks(head.score, img_side, txt_emb), index=index, eta=eta)
            if hard_weight > 0:
                rows = batch["hard_index"].to(env.device)
                pair_score = (head or model.head).score_pairs
                # on the device: NCCL reduces CUDA tensors only
                local = torch.tensor(float(rows.numel()), device=env.device)
                count = int(round(float(all_reduce_mean(local, env)) * env.world_size))
                hard_value = hard_negative_term(pair_score(img_side[rows], txt_emb[rows]),
                                                pair_score(img_side[rows], txt_all[images.shape[0]:].float()),
                                                hard_tau, count, env.world_size)
                value = value + hard_weight * hard_value
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(value).backward()
                scaler.unscale_(optimizer)
            else:
                value.backward()
            average_grads(loss_params, env)
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(all_params, clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            step += 1
            if budget is not None:
                fitted = budget.observe(step, time.perf_counter(), elapsed(), total)
                if fitted is not None:
                    total = _fix_budget(cfg, env, fitted, total)
                    schedule.total = total
                    metrics.set_total(total)
                    if budget.done(step, total):
                        state["budget_fixed"], budget = True, None

            metrics.advance(1)
            if step % int(cfg["log"]["every"]) == 0 or step == total:
                last_loss = float(all_reduce_mean(value.detach().float(), env))
                if not math.isfinite(last_loss):
                    raise MedclrError(f"loss became {last_loss} at step {step}; lower optim.lr or check the data")
                now = time.perf_counter()
                rate = (step - window[1]) * gb / max(now - window[0], 1e-9)
                window = (now, step)
                epoch, _ = sampler.position(step - 1)
                line = {"step": step, "epoch": epoch, "loss": last_loss, "lr": scheduler.get_last_lr()[0],
                        "pairs_per_s": round(rate, 2), "elapsed_s": round(elapsed(), 1)}
                if hard_weight > 0:  # the hard-negative term alone (part of "loss"): log 2 = no preference
                    line["hard_negative_term"] = float(all_reduce_mean(hard_value.detach().float(), env))
                metrics.write(line)
                metrics.advance(0, {"loss": f"{last_loss:.4f}", "pairs/s": f"{rate:.1f}"})
            val_every = cfg["val"]["every"]
            if val_every and step % int(val_every) == 0 and step < total:
                validate()
            if step % int(cfg["ckpt"]["every"]) == 0 and step < total:
                save(last_loss)
        if step > start_step or plan.resume is None:
            if cfg["val"]["every"] is not None:
                val_res = validate()
            save(last_loss)
    finally:
        metrics.close()
    run_s = time.perf_counter() - t_run
    return {"out": str(out), "steps": step, "start_step": start_step, "total_steps": total, "last_loss": last_loss,
            "pairs_per_s": round((step - start_step) * gb / max(run_s, 1e-9), 2), "seconds": round(run_s, 1),
            "val": val_res}


def _fix_budget(cfg: dict, env: DistEnv, fitted: int, total: int) -> int:
    """Rank 0's fitted step count for train.max_minutes, the same on every rank."""
    new_total = broadcast_object(fitted, env)
    if env.is_main and new_total != total:
        log.info("train.max_minutes=%s: %d steps instead of %d", cfg["train"]["max_minutes"], new_total, total)
    return new_total
