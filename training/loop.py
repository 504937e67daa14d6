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

A loss with a schedule keeps it itself (``medclr.losses.base``: ``configure`` is called once in
``preflight``, ``on_step`` before every step), as a function of the step or in its checkpointed
buffers; this loop names no loss and no loss option.
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

from medclr.data.pairs import study_weights
from medclr.distributed import cleanup, env_world
from medclr.errors import MedclrError
from medclr.files import check_free_space
from medclr.losses.base import ContrastiveLoss
from medclr.losses.distributed import score_blocks
from medclr.losses.hard_negatives import hard_negative_term
from medclr.progress import show_progress
from medclr.training import checkpoint as ckpt_mod
from medclr.training.augment import apply_on_device, augment_place
from medclr.training.budget import StepBudget
from medclr.training.config import dump_yaml, loss_kwargs, needs_num_samples, takes_num_texts
from medclr.training.data import Collate, PairDataset, TrainTable, check_images_exist, load_table
from medclr.training.distributed import DistEnv, all_reduce_mean, average_grads, barrier, broadcast_object, setup
from medclr.training.hooks import MetricsLogger, Validator
from medclr.training.optim import WarmupCosine, build_optimizer, param_groups
from medclr.training.sampler import GlobalBatchSampler

log = logging.getLogger(__name__)


class TwoTower(nn.Module):
    """The part DDP wraps: images -> the head's image side, tokens -> sentence embeddings (the batch's
    sentences, then any hard negatives the collate appended; the loop splits them).

    Cosine head: the global embedding (the loss pairs embeddings, exactly as before heads were
    trained). Any other head (LSE+NL): ``head.image_side`` (NL-contextualised unit region cells), so
    the head's parameters are inside DDP and the optimizer; the loss then scores pairs through
    ``head.score`` on the gathered sides (``medclr.losses.distributed.score_blocks``)."""

    def __init__(self, image_encoder: nn.Module, text_encoder: nn.Module, head: nn.Module | None = None,
                 text_buckets: int = 1) -> None:
        super().__init__()
        self.image_encoder, self.text_encoder, self.head = image_encoder, text_encoder, head
        self.text_buckets = text_buckets  # TextEncoder.embed: sentences run in chunks of similar length

    def forward(self, images: torch.Tensor, tokens: dict) -> tuple[torch.Tensor, torch.Tensor]:
        features, text = self.image_encoder(images), self.text_encoder.embed(**tokens, buckets=self.text_buckets)
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
    loss: ContrastiveLoss  # built (its argument values checked) and configured for this run
    loss_warnings: list[str]


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
        total = resumed_total(cfg, state, ckpt)
    elif ckpt_mod.latest_checkpoint(out) is not None:
        raise MedclrError(f"out {out} already holds a training run ({ckpt_mod.latest_checkpoint(out).name}); "
                          "pass --resume to continue it, or choose another out")
    loss, warnings = configured_loss(cfg, n, spe, total, num_texts=len(table.texts))
    check_images_exist(table, cfg["data"]["manifest"])
    return Plan(cfg, out, text_model, table, ckpt, state, spe, total, loss, warnings)


def resumed_total(cfg: dict, state: dict, ckpt: Path) -> int:
    """The step count of a resumed run: the checkpoint's, or a larger ``train.max_steps`` to extend it (also a
    finished run). The learning-rate schedule is a function of (step, total), so an extended run continues on
    the cosine of the new total: from the resumed step on, the rate is what a run planned for that total would
    have had there (a rise from the old run's end, docs/training.md). A total below the checkpoint's is
    refused in one line; a run sized by ``train.max_minutes`` keeps the total its budget fixed."""
    saved, done = int(state["total_steps"]), int(state["step"])
    asked = cfg["train"]["max_steps"]
    if asked is None or int(asked) == saved or cfg["train"]["max_minutes"] is not None:
        return saved
    if int(asked) < saved:
        raise MedclrError(f"--resume {ckpt}: train.max_steps {int(asked)} is below the run's {saved} steps "
                          f"({done} done); resume with train.max_steps={saved}, or more to extend it")
    log.info("--resume %s: train.max_steps %d extends the run from %d to %d steps (the cosine schedule "
             "continues on the new length)", ckpt, int(asked), saved, int(asked))
    return int(asked)


def configured_loss(cfg: dict, num_samples: int, steps_per_epoch: int, total_steps: int,
                    num_texts: int | None = None) -> tuple[ContrastiveLoss, list[str]]:
    """The run's loss, built from the `loss:` section and fitted to the run by its own ``configure``
    hook (e.g. NUCLR's freeze in epochs -> steps), with the warnings that hook returns. A loss with
    per-text tables keys them by sentence (``num_texts`` distinct sentences) under ``loss.zeta_key:
    sentence``, by the study under ``study``."""
    from medclr.losses import build_loss

    kwargs = loss_kwargs(cfg)
    if needs_num_samples(cfg["loss"]["name"]):
        kwargs["num_samples"] = num_samples
    if cfg["loss"].get("zeta_key") == "sentence" and takes_num_texts(cfg["loss"]["name"]):
        if num_texts is None:
            raise MedclrError("loss.zeta_key=sentence needs the number of distinct training sentences")
        kwargs["num_texts"] = int(num_texts)
    loss = build_loss(cfg["loss"]["name"], **kwargs)
    warnings = loss.configure(num_samples=num_samples, steps_per_epoch=steps_per_epoch, total_steps=total_steps)
    return loss, list(warnings or [])


def native_bf16(device: torch.device) -> bool:
    """Whether the device runs bf16 matmuls and convolutions in hardware: a CUDA GPU that supports it,
    or a CPU with AVX512-BF16 or AMX (oneDNN's bf16 kernels; elsewhere bf16 is emulated and slower than
    float32). On such a CPU the cpu_small step runs ~1.5x faster under bf16 (docs/performance.md)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return device.type == "cpu" and any(probe is not None and probe() for probe in probes)


def _amp(cfg: dict, device: torch.device):
    p = cfg["train"]["precision"]
    if p == "auto":
        p = "bf16" if native_bf16(device) else "fp32"
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[p]


def _text_buckets(cfg: dict, device: torch.device) -> int:
    """model.text_buckets; auto = 4 on a CPU (the text tower's work falls ~1.8x with the padding), 1 on a GPU
    (there the padded positions cost little and every chunk is another round of kernel launches)."""
    n = cfg["model"]["text_buckets"]
    return (1 if device.type == "cuda" else 4) if n == "auto" else int(n)


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


def _keep_configured_gamma(model: nn.Module, m: dict, is_main: bool) -> None:
    """A fixed LSE gamma is a setting, not a weight: the init checkpoint's file holds its own run's gamma, and this
    run's model.lse_gamma wins over it (a learned gamma is a weight and is kept as the init trained it)."""
    if m["head"] != "lse_nl" or m["lse_learn_gamma"]:
        return
    theirs, ours = float(model.head.gamma), float(m["lse_gamma"])
    with torch.no_grad():
        model.head.log_gamma.fill_(math.log(ours))
    if is_main and not math.isclose(theirs, ours, rel_tol=1e-3):
        log.info("model.init: LSE gamma %g from model.lse_gamma (the init checkpoint trained with %g)", ours, theirs)


def _build(plan: Plan, env: DistEnv) -> tuple[nn.Module, ContrastiveLoss]:
    from medclr.models import build_dual_encoder

    cfg, m = plan.cfg, plan.cfg["model"]
    seed = int(cfg["seed"])
    torch.manual_seed(seed)  # identical initialisation on every rank
    channels_last = env.device.type == "cuda" if m["channels_last"] == "auto" else bool(m["channels_last"])
    head = m["head"] if m["head"] == "cosine" else {"type": m["head"], "gamma": float(m["lse_gamma"]),
                                                      "learn_gamma": bool(m["lse_learn_gamma"])}
    model = build_dual_encoder(plan.text_model, arch=m["arch"], joint_dim=int(m["joint_dim"]), head=head,
                               image_pretrained=m["image_pretrained"], image_weights=m["image_weights"],
                               input_norm=m["input_norm"], projector=m["projector"],
                               channels_last=channels_last, pooling=m["pooling"], max_length=int(m["max_length"]),
                               output_stride=int(m["output_stride"]), stages=int(m["stages"]),
                               allow_network=bool(m["allow_network"]), trust_remote_code=bool(m["trust_remote_code"]))
    if m["head"] != "cosine":
        model.head.trained = True  # the loss scores pairs through it (TwoTower, score_blocks)
    if m["init"] is not None and plan.resume is None:  # a resumed run's weights come from its own checkpoint
        sha = ckpt_mod.init_weights(model, m["init"])
        if env.is_main:
            log.info("model.init: weights from %s (SHA-256 %s...)", m["init"], sha[:12])
        _keep_configured_gamma(model, m, env.is_main)
    if env.is_main:
        for warning in plan.loss_warnings:
            log.warning("loss %s: %s", cfg["loss"]["name"], warning)
    torch.manual_seed(seed + 7919 * env.rank)  # per-rank dropout streams from here on
    return model.to(env.device), plan.loss.to(env.device)


def _optimizer(cfg: dict, model: nn.Module, loss: nn.Module, tower: nn.Module, total: int, device: torch.device):
    """AdamW over the towers, the head and the loss's parameters, and its warm-up + cosine schedule."""
    o = cfg["optim"]
    groups = param_groups(model, loss, [tower], float(o["lr"]), None if o["lr_text"] is None else float(o["lr_text"]),
                          float(o["weight_decay"]))
    optimizer = build_optimizer(groups, cfg, device)
    schedule = WarmupCosine(int(o["warmup_steps"]), total, float(o["min_lr_ratio"]))
    return optimizer, schedule, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def _runner(tower: nn.Module, cfg: dict, env: DistEnv) -> nn.Module:
    """The tower as the steps call it: inside DDP on several processes, compiled when asked."""
    runner: nn.Module = tower
    if env.enabled:
        runner = nn.parallel.DistributedDataParallel(
            tower, device_ids=[env.device.index] if env.device.type == "cuda" else None, gradient_as_bucket_view=True)
    if cfg["train"]["compile"]:
        runner = torch.compile(runner)
    return runner


def _loader(ds: PairDataset, sampler: GlobalBatchSampler, cfg: dict, env: DistEnv, text_encoder: nn.Module):
    nw = _num_workers(cfg, env)
    return torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, num_workers=nw, collate_fn=Collate(text_encoder),
        pin_memory=env.device.type == "cuda", persistent_workers=nw > 0, prefetch_factor=4 if nw else None,
        generator=torch.Generator().manual_seed(int(cfg["seed"])))


def on_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on the device (non-blocking: the loader pins them on CUDA), with the
    intensity augmentation applied there when the loader shipped its parameters (data.augment_on)."""
    moved = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    moved["tokens"] = {k: v.to(device, non_blocking=True) for k, v in batch["tokens"].items()}
    if moved.get("augment") is not None:
        moved["images"], moved["augment"] = apply_on_device(moved["images"], moved["augment"]), None
    return moved


def _report_quality(plan: Plan, ds: PairDataset) -> None:
    """The training rows' data-quality summary (``medclr.data.quality``): one log line, data_quality.json in OUT;
    once the images are cached, so that it counts the blank ones too."""
    from medclr.data.quality import data_quality, summary_line, write_quality
    from medclr.training.data import read_manifest_split

    rows, _ = read_manifest_split(plan.cfg["data"]["manifest"], plan.cfg["data"]["split"])
    quality = data_quality(rows, blank_image=ds.blank_images())
    log.info("%s (%s)", summary_line(quality), write_quality(quality, plan.out).name)


def _run(plan: Plan, env: DistEnv) -> dict:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers fork after the tokenizer is used
    if env.is_main:
        plan.out.mkdir(parents=True, exist_ok=True)
        ckpt_mod.clean_stale(plan.out)
    run = Run(plan, env)
    try:
        if env.is_main:
            _report_quality(plan, run.ds)
        run.steps()
        run.finish()
    finally:
        run.metrics.close()
    return run.summary()


class Run:
    """One rank's training run: the parts built from the plan (in an order that keeps the RNG
    streams of a resumed run), the step counter, the clock, and the steps."""

    def __init__(self, plan: Plan, env: DistEnv) -> None:
        cfg = plan.cfg
        self.plan, self.env, self.cfg = plan, env, cfg
        self.model, self.loss = _build(plan, env)
        self.head = None if self.model.head.kind == "cosine" else self.model.head
        tower = TwoTower(self.model.image_encoder, self.model.text_encoder, self.head, _text_buckets(cfg, env.device))
        self.optimizer, self.schedule, self.scheduler = _optimizer(cfg, self.model, self.loss, tower,
                                                                   plan.total_steps, env.device)
        self.amp_dtype = _amp(cfg, env.device)
        self.scaler = torch.amp.GradScaler(env.device.type) if self.amp_dtype == torch.float16 else None
        # before the images are cached, on every rank (one fails, all fail: no rank waits at a barrier)
        check_free_space(plan.out / ckpt_mod.CKPT_DIR, ckpt_mod.space_needed(
            plan.out, self.model, self.loss, self.optimizer, int(cfg["ckpt"]["keep_last"])),
            f"the run's checkpoints (ckpt.keep_last {cfg['ckpt']['keep_last']} + 1 step folders)")
        self.ds = PairDataset(plan.table, cfg, cache_progress=env.is_main and show_progress(cfg["log"]["progress"]),
                              device_augment=augment_place(cfg["data"]["augment_on"], env.device) == "device")
        self.gb = int(cfg["train"]["batch_size"])
        weights = study_weights(plan.table.sentences, cfg["data"]["study_sampling"], float(cfg["data"]["study_balance"]))
        self.sampler = GlobalBatchSampler(len(self.ds), self.gb, env.rank, env.world_size, int(cfg["seed"]),
                                          weights=weights)
        self.step, self.state = self._restore()
        self.sampler.step = self.step
        self.total = plan.total_steps
        self.schedule.total = self.total
        self.runner = _runner(tower, cfg, env)
        self.loader = _loader(self.ds, self.sampler, cfg, env, self.model.text_encoder)
        self.metrics = MetricsLogger(plan.out, cfg, env.is_main, self.step, self.total)
        validating = cfg["val"]["every"] is not None and env.is_main
        self.validator = Validator(cfg, env.device, self.amp_dtype) if validating else None
        self.hard_weight, self.hard_tau = float(cfg["hard_negatives"]["weight"]), float(cfg["hard_negatives"]["tau"])
        self.clip = float(cfg["optim"]["grad_clip"] or 0.0)
        self.all_params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.loss_params = [p for p in self.loss.parameters() if p.requires_grad]
        self.model.train()
        self.loss.train()
        self.t_run = time.perf_counter()
        self.elapsed0 = float(self.state.get("elapsed_s", 0.0))
        self.start_step, self.last_loss, self.val_res = self.step, None, {}
        self.findings = None  # medclr.findings record of the final validation (checkpoint_meta.json)

    def _restore(self) -> tuple[int, dict]:
        """(step, trainer state): 0 and a fresh state, or the checkpoint's (model, optimizer, ..., RNGs loaded)."""
        plan, env = self.plan, self.env
        state = {"budget_fixed": self.cfg["train"]["max_minutes"] is None, "elapsed_s": 0.0}
        if plan.resume is None:
            return 0, state
        state = ckpt_mod.restore_checkpoint(plan.resume, model=self.model, loss=self.loss, optimizer=self.optimizer,
                                         scheduler=self.scheduler, scaler=self.scaler, env=env, texts=plan.table.texts)
        step = int(state["step"])
        if not state.get("rng_restored"):
            log.warning("resume: no RNG state for rank %d (world size changed?); dropout will differ", env.rank)
        if env.is_main:
            log.info("resumed from %s at step %d of %d", plan.resume, step, plan.total_steps)
        return step, state

    def elapsed(self) -> float:
        return self.elapsed0 + time.perf_counter() - self.t_run

    # ------------------------------------------------------------------ the steps

    def steps(self) -> None:
        cfg = self.cfg
        self.window = (time.perf_counter(), self.step)
        budget = None if self.state["budget_fixed"] else StepBudget(float(cfg["train"]["max_minutes"]) * 60.0,
                                                                    self.total)
        it = iter(self.loader)
        while self.step < self.total:
            value, hard_value = self.forward(next(it))
            self.update(value)
            self.step += 1
            if budget is not None and self._refit(budget):
                self.state["budget_fixed"], budget = True, None
            self.metrics.advance(1)
            if self.step % int(cfg["log"]["every"]) == 0 or self.step == self.total:
                self.log(value, hard_value)
            val_every = cfg["val"]["every"]
            if val_every and self.step % int(val_every) == 0 and self.step < self.total:
                self.validate()
            if self.step % int(cfg["ckpt"]["every"]) == 0 and self.step < self.total:
                self.save()

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step's loss (and its hard-negative term alone, when that is on)."""
        env, loss, head = self.env, self.loss, self.head
        batch = on_device(batch, env.device)
        images, tokens, index, eta = batch["images"], batch["tokens"], batch["index"], batch["eta"]
        text_index = batch["text_index"]
        loss.on_step(self.step, self.total)  # the loss's own schedule (medclr.losses.base)
        amp = self.amp_dtype
        with torch.autocast(env.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            img_side, txt_all = self.runner(images, tokens)
        # exps/logs in float32: the losses upcast and disable autocast themselves; be explicit anyway
        img_side, txt_emb = img_side.float(), txt_all[: images.shape[0]].float()
        if head is None:
            value = loss(img_side, txt_emb, index=index, eta=eta, text_index=text_index)
        else:
            value = loss(sims=score_blocks(head.score, img_side, txt_emb), index=index, eta=eta, text_index=text_index)
        if self.hard_weight <= 0:
            return value, None
        rows = batch["hard_index"]
        pair_score = (head or self.model.head).score_pairs
        # on the device: NCCL reduces CUDA tensors only
        local = torch.tensor(float(rows.numel()), device=env.device)
        count = int(round(float(all_reduce_mean(local, env)) * env.world_size))
        hard_value = hard_negative_term(pair_score(img_side[rows], txt_emb[rows]),
                                        pair_score(img_side[rows], txt_all[images.shape[0]:].float()),
                                        self.hard_tau, count, env.world_size)
        return value + self.hard_weight * hard_value, hard_value

    def update(self, value: torch.Tensor) -> None:
        """Backward, the loss's own gradients averaged, clipping, the optimizer and lr scheduler steps."""
        optimizer, scaler = self.optimizer, self.scaler
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(value).backward()
            scaler.unscale_(optimizer)
        else:
            value.backward()
        average_grads(self.loss_params, self.env)
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.all_params, self.clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        self.scheduler.step()

    def _refit(self, budget: StepBudget) -> bool:
        """train.max_minutes: refit the step count when the budget has a new estimate; True once it is final."""
        fitted = budget.observe(self.step, time.perf_counter(), self.elapsed(), self.total)
        if fitted is None:
            return False
        self.total = _fix_budget(self.cfg, self.env, fitted, self.total)
        self.schedule.total = self.total
        self.metrics.set_total(self.total)
        return budget.done(self.step, self.total)

    def log(self, value: torch.Tensor, hard_value: torch.Tensor | None) -> None:
        env = self.env
        self.last_loss = float(all_reduce_mean(value.detach().float(), env))
        if not math.isfinite(self.last_loss):
            raise MedclrError(f"loss became {self.last_loss} at step {self.step}; lower optim.lr or check the data")
        now = time.perf_counter()
        rate = (self.step - self.window[1]) * self.gb / max(now - self.window[0], 1e-9)
        self.window = (now, self.step)
        epoch, _ = self.sampler.position(self.step - 1)
        line = {"step": self.step, "epoch": epoch, "loss": self.last_loss, "lr": self.scheduler.get_last_lr()[0],
                "pairs_per_s": round(rate, 2), "elapsed_s": round(self.elapsed(), 1)}
        if hard_value is not None:  # the hard-negative term alone (part of "loss"): log 2 = no preference
            line["hard_negative_term"] = float(all_reduce_mean(hard_value.detach().float(), env))
        self.metrics.write(line)
        self.metrics.advance(0, {"loss": f"{self.last_loss:.4f}", "pairs/s": f"{rate:.1f}"})

    # ------------------------------------------------------------------ validation, checkpoints, the end

    def validate(self) -> dict:
        res = self.validator(self.model) if self.validator is not None else {}
        if res:
            self.metrics.write({"step": self.step, **res})
        barrier(self.env)
        return res

    def trainer_state(self) -> dict:
        plan, cfg, env = self.plan, self.cfg, self.env
        epoch, k = self.sampler.position(self.step)
        return {"step": self.step, "epoch": epoch, "batch_in_epoch": k, "total_steps": self.total,
                "budget_fixed": self.state["budget_fixed"], "elapsed_s": self.elapsed(),
                "steps_per_epoch": plan.steps_per_epoch, "n_train": len(self.ds), "fingerprint": plan.table.fingerprint,
                "global_batch": self.gb, "world_size": env.world_size, "seed": int(cfg["seed"]),
                "loss": cfg["loss"]["name"], "manifest": str(cfg["data"]["manifest"]), "text_model": plan.text_model,
                "last_loss": self.last_loss, "torch": torch.__version__, "config": cfg,
                "findings": self.findings}

    def save(self) -> None:
        cfg, env, out = self.cfg, self.env, self.plan.out
        ckpt_mod.save_checkpoint(out=out, step=self.step, model=self.model, loss=self.loss, optimizer=self.optimizer,
                                 scheduler=self.scheduler, scaler=self.scaler, trainer_state=self.trainer_state(),
                                 config_yaml=dump_yaml(cfg), env=env, keep_last=int(cfg["ckpt"]["keep_last"]),
                                 barrier=lambda: barrier(env),
                                 sample_index=self.plan.table.manifest_index, texts=self.plan.table.texts)
        if env.is_main:
            print(f"checkpoint {ckpt_mod.step_dir(out, self.step)}", flush=True)

    def finish(self) -> None:
        """The last validation and checkpoint (none when a resumed run had nothing left to do)."""
        if self.step > self.start_step or self.plan.resume is None:
            if self.cfg["val"]["every"] is not None:
                self.val_res = self.validate()
                self.findings = self.validator.findings(self.model) if self.validator is not None else None
                barrier(self.env)
            self.save()

    def summary(self) -> dict:
        run_s = time.perf_counter() - self.t_run
        return {"out": str(self.plan.out), "steps": self.step, "start_step": self.start_step, "total_steps": self.total,
                "last_loss": self.last_loss, "precision": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
                    self.amp_dtype, "fp32"),
                "pairs_per_s": round((self.step - self.start_step) * self.gb / max(run_s, 1e-9), 2),
                "seconds": round(run_s, 1), "val": self.val_res}


def _fix_budget(cfg: dict, env: DistEnv, fitted: int, total: int) -> int:
    """Rank 0's fitted step count for train.max_minutes, the same on every rank."""
    new_total = broadcast_object(fitted, env)
    if env.is_main and new_total != total:
        log.info("train.max_minutes=%s: %d steps instead of %d", cfg["train"]["max_minutes"], new_total, total)
    return new_total
