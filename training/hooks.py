"""Run-time reporting: progress bar, JSON-lines metrics, optional TensorBoard, and the validation hook.

Only rank 0 reports. ``OUT/metrics.jsonl`` gets one JSON object per logging step
(``{"step", "epoch", "loss", "lr", "pairs_per_s", "elapsed_s"}``) and one per validation
(``{"step", "val/...": ...}``). On resume, lines beyond the resumed step (written by the killed
run after its last checkpoint) are dropped, so the file reads as one uninterrupted run.

Validation logs the positive/negative-pair cosines, image->report retrieval and, with labels, the
CheX5 zero-shot AUC with the paper's prompts. Scores and metrics are `medclr eval`'s own, from the
core: ``medclr.prompts`` (prompts reduced from unnormalised projections, scored by the model's own
similarity head) and ``medclr.metrics`` (R@K, AUC); training imports nothing from evaluation.
It is RNG-neutral (fork_rng, eval mode), so validating never changes what training does next.
At the end of training :meth:`Validator.findings` scores every labelled validation image and records which
CheX5 findings the model reads (``medclr.findings``: AUC with CI, direction, Platt calibration, operating
point), which the final checkpoint keeps in ``checkpoint_meta.json``. Validation rows without any CheX5 label (a
CSV corpus) are labelled from their reports by medclr's rule labeller, as `medclr eval` labels such a corpus
(``medclr.data.labeller.labels_or_rules``): one log line says so, and the findings record says ``labels: rules``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from medclr.errors import MedclrError
from medclr.progress import progress_bar, show_progress

log = logging.getLogger(__name__)


class MetricsLogger:
    def __init__(self, out: Path, cfg: dict, enabled: bool, start_step: int, total_steps: int) -> None:
        self.enabled = enabled
        self.path = Path(out) / "metrics.jsonl"
        self.tb = None
        self.bar = None
        if not enabled:
            return
        self._truncate(start_step)
        if cfg["log"]["tensorboard"]:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MedclrError("log.tensorboard=true needs the tensorboard package (pip install tensorboard)") from None
            self.tb = SummaryWriter(str(Path(out) / "tensorboard"))
        if show_progress(cfg["log"]["progress"]):
            self.bar = progress_bar(total=total_steps, initial=start_step, desc="train", unit="step",
                                    dynamic_ncols=True, enabled=True)

    def _truncate(self, start_step: int) -> None:
        if not self.path.is_file():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            try:
                if int(json.loads(line).get("step", 0)) <= start_step:
                    keep.append(line)
            except (ValueError, AttributeError):
                continue
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        tmp.replace(self.path)

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, default=float) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k if "/" in k else f"train/{k}", v, record["step"])
        if self.bar is None and "loss" in record:
            log.info("step %d  loss %.4f  lr %.3g  %.1f pairs/s", record["step"], record["loss"], record["lr"],
                     record.get("pairs_per_s", float("nan")))

    def advance(self, n: int, postfix: dict | None = None) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()


class Validator:
    """Embeds a fixed subset of the validation split and scores it (rank 0 only)."""

    def __init__(self, cfg: dict, device: torch.device, amp_dtype) -> None:
        self.cfg, self.device, self.amp_dtype = cfg, device, amp_dtype
        self.ds = None
        self.unavailable = None
        self.label_source = "manifest"  # or "rules": the validation rows had no labels (medclr.findings)

    def _table(self):
        """The validation rows (``medclr.training.data.load_table``); rows without any CheX5 label get them from
        their reports by rules (``medclr.data.labeller.labels_or_rules``, the rule `medclr eval` applies)."""
        import pandas as pd

        from medclr.data.labeller import RULES_NOTE, labels_or_rules
        from medclr.data.labels import CHEX5
        from medclr.training.data import load_table

        split = self.cfg["data"]["val_split"]
        table = load_table(self.cfg, split=split, eta=False)
        given = {} if table.labels is None else dict(zip(CHEX5, table.labels.T))
        rows, filled = labels_or_rules(pd.DataFrame({"sentences": table.sentences, **given}), CHEX5)
        if filled:
            table.labels = rows[list(CHEX5)].to_numpy(dtype=np.float64)
            if self.label_source != "rules":
                log.info("validation: no CheX5 labels in the %s split of the manifest: %s %s", split,
                         ", ".join(filled), RULES_NOTE)
            self.label_source = "rules"
        return table

    def _dataset(self):
        if self.ds is None and self.unavailable is None:
            from medclr.training.data import PairDataset

            try:
                table = self._table()
            except MedclrError as exc:
                self.unavailable = str(exc)
                log.info("validation skipped: %s", exc)
                return None
            k = min(len(table), int(self.cfg["val"]["max_images"]))
            for f in ("paths", "sentences"):
                setattr(table, f, getattr(table, f)[:k])
            table.manifest_index = table.manifest_index[:k]
            table.labels = None if table.labels is None else table.labels[:k]
            self.ds = PairDataset(table, self.cfg)
        return self.ds

    @torch.no_grad()
    def __call__(self, model) -> dict:
        ds = self._dataset()
        if ds is None or len(ds) < 2:
            return {}
        was_training = model.training
        model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                return self._score(model, ds)
        finally:
            model.train(was_training)

    def _embed_images(self, model, ds, prompts=None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(N x D global embeddings, and with ``prompts`` (``medclr.prompts.prompt_embeddings``) the
        N x C zero-shot scores s_pos, s_neg: ``medclr.prompts.zero_shot_scores``, as `medclr eval`)."""
        from medclr.prompts import zero_shot_scores

        out, pos, neg = [], [], []
        for i in range(0, len(ds), 64):
            x = torch.stack([ds[j]["image"] for j in range(i, min(len(ds), i + 64))]).to(self.device)
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                feats = model.encode_image(x).float()
            out.append(feats.global_emb.cpu())
            if prompts is not None:  # the head in float32, as the inference engine scores
                _classes, sp, sn = zero_shot_scores(model.similarity, feats, prompts)
                pos.append(sp.cpu())
                neg.append(sn.cpu())
        cat = (lambda xs: torch.cat(xs).numpy() if xs else None)  # noqa: E731
        return torch.cat(out).numpy(), cat(pos), cat(neg)

    def _embed_texts(self, model, texts: list[str], normalize: bool = True) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            return model.text_encoder.encode(texts, batch_size=128, normalize=normalize).float()

    def _zero_shot_prompts(self, model, labels):
        """The CheX5 prompts of ``val.prompts`` (a built-in set: ``paper`` or ``report``) reduced as `medclr eval`
        reduces them (``medclr.prompts``), or None without labels."""
        if labels is None:
            return None
        from medclr.data.labels import CHEX5
        from medclr.prompts import BUILTIN_PROMPTS, prompt_embeddings

        prompts = BUILTIN_PROMPTS[self.cfg["val"]["prompts"]]
        return prompt_embeddings(lambda texts: self._embed_texts(model, texts, normalize=False),
                                 {c: prompts[c] for c in CHEX5})

    @torch.no_grad()
    def findings(self, model) -> dict | None:
        """Which CheX5 findings the model reads (``medclr.findings.fit_findings``), from every labelled image
        of the validation split (not the ``val.max_images`` subset: the rare findings need all their
        positives); None without a labelled validation split."""
        from medclr.data.labels import CHEX5
        from medclr.findings import fit_findings
        from medclr.training.data import PairDataset

        try:
            table = self._table()
        except MedclrError as exc:
            log.info("per-finding validation skipped: %s", exc)
            return None
        if table.labels is None or len(table) < 2:
            return None
        was_training = model.training
        model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                ds = PairDataset(table, self.cfg)
                _img, s_pos, s_neg = self._embed_images(model, ds, self._zero_shot_prompts(model, table.labels))
        finally:
            model.train(was_training)
        return fit_findings(s_pos - s_neg, table.labels, CHEX5, seed=int(self.cfg["seed"]),
                            split=str(self.cfg["data"]["val_split"]), label_source=self.label_source,
                            prompts=str(self.cfg["val"]["prompts"]))

    def _score(self, model, ds) -> dict:
        from medclr.metrics import retrieval_metrics, zero_shot_metrics  # scipy, scikit-learn: only when validating

        t0 = time.perf_counter()
        table = ds.table
        prompts = self._zero_shot_prompts(model, table.labels)
        img, s_pos, s_neg = self._embed_images(model, ds, prompts)
        flat = [s for sents in table.sentences for s in sents]
        emb = self._embed_texts(model, flat).cpu().numpy()
        # Report embedding = normalised mean of its sentence embeddings.
        bounds = np.cumsum([0] + [len(s) for s in table.sentences])
        rep = np.stack([emb[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:])])
        rep /= np.linalg.norm(rep, axis=1, keepdims=True).clip(1e-12)
        img_n = img / np.linalg.norm(img, axis=1, keepdims=True).clip(1e-12)
        scores = img_n @ rep.T
        res: dict = {"val/pos_cosine": float(np.mean(np.diag(scores))),
                     "val/neg_cosine": float((scores.sum() - np.trace(scores)) / max(1, scores.size - len(scores)))}
        r = retrieval_metrics(scores, ks=(1, 5, 10))
        res.update({f"val/i2t_{k}": float(v) for k, v in r.items()})
        if s_pos is not None:
            from medclr.data.labels import CHEX5

            m = zero_shot_metrics(s_pos, s_neg, table.labels, classes=CHEX5, n_boot=0)
            res["val/chex5_auc"] = m["macro"]["AUC"]
            res.update({f"val/auc/{c}": m["per_class"][c]["AUC"] for c in CHEX5})
        res["val/seconds"] = round(time.perf_counter() - t0, 2)
        return res
