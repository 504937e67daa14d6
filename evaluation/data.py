"""What `medclr eval` evaluates: the manifest rows, the MS-CXR phrases, labels and prompts, and the
one encoding pass over their images (through :class:`Model`, the thin adapter over ``medclr.inference``).

``--data`` is either

* a manifest parquet (``medclr prepare`` / ``medclr phantom``), with its MS-CXR boxes in
  ``<stem>.mscxr.parquet`` beside it when ``prepare --mscxr`` made one; or
* a directory laid out as MIMIC-CXR-JPG (a CXR-Phantom root or the real data set): read with
  :func:`medclr.data.readers.mimic.read_mimic_cxr_jpg` (every view) and the
  ``MS_CXR_Local_Alignment_v*.csv`` inside it with :func:`medclr.data.readers.mscxr.read_mscxr`.

MS-CXR rows are matched to manifest rows by ``dicom_id`` (never by a stored index, which may come
from another manifest). One evaluation sample of grounding/retrieval is one PHRASE: the rows sharing
``(dicom_id, label_text)``; its boxes stay separate here (the union is taken by the metric).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from medclr.data.groundtruth import GROUND_TRUTH_FILE, attach_ground_truth  # the table `medclr phantom` writes
from medclr.data.labels import CHEX5
from medclr.errors import MedclrError
from medclr.evaluation import grounding as G
from medclr.models.image import ImageFeatures
from medclr.progress import progress_bar

log = logging.getLogger(__name__)
MSCXR_GLOB = "MS_CXR_Local_Alignment_v*.csv"


@dataclass
class EvalData:
    """A manifest (``manifest.attrs["root"]`` = image root) and, when present, its MS-CXR boxes."""

    manifest: pd.DataFrame
    mscxr: pd.DataFrame | None
    source: str
    mscxr_source: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return Path(self.manifest.attrs.get("root", "") or ".")

    def image_path(self, index: int) -> str:
        return str(self.root / self.manifest["image_path"].iat[int(index)])


def _attach_mscxr(df: pd.DataFrame, boxes: pd.DataFrame, where: str, notes: list[str]) -> pd.DataFrame | None:
    lookup = dict(zip(df["dicom_id"].astype(str), df["index"].astype(np.int64)))
    boxes = boxes.copy()
    boxes["dicom_id"] = boxes["dicom_id"].astype(str)
    boxes["index"] = np.array([lookup.get(d, -1) for d in boxes["dicom_id"]], dtype=np.int64)
    unmatched = int((boxes["index"] < 0).sum())
    if unmatched == len(boxes):
        raise MedclrError(f"{where}: none of its dicom_ids is in the manifest (wrong data set?)")
    if unmatched:
        notes.append(f"{unmatched} of {len(boxes)} MS-CXR boxes have no image in the manifest; left out")
    return boxes[boxes["index"] >= 0].reset_index(drop=True)


def load_eval_data(path: str | os.PathLike) -> EvalData:
    """Read ``--data`` (manifest parquet or MIMIC-layout directory). Bad input: one clear MedclrError."""
    p = Path(path).expanduser()
    notes: list[str] = []
    if p.is_dir():
        from medclr.data.readers.mimic import read_mimic_cxr_jpg
        from medclr.data.readers.mscxr import read_mscxr

        if not (p / "files").is_dir():
            raise MedclrError(f"{p}: not a manifest parquet nor a MIMIC-CXR-JPG / CXR-Phantom root (no files/ folder)")
        df = read_mimic_cxr_jpg(p, views=None)
        df.attrs["root"] = str(p.resolve())
        found = sorted(p.glob(MSCXR_GLOB))
        mscxr, msrc = None, None
        if found:
            msrc = str(found[-1])  # the newest version when several are there
            mscxr = _attach_mscxr(df, read_mscxr(found[-1]), msrc, notes)
        return with_labels(add_latent_classes(EvalData(df, mscxr, str(p), msrc, notes)))
    if p.is_file():
        from medclr.data.manifest import read_manifest

        df = read_manifest(p)
        if not df.attrs.get("root"):
            df.attrs["root"] = str(p.resolve().parent)
        beside = p.with_name(p.stem + ".mscxr.parquet")
        mscxr, msrc = None, None
        if beside.is_file():
            try:
                boxes = pd.read_parquet(beside)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types
                raise MedclrError(f"{beside}: not a readable MS-CXR box table ({type(exc).__name__})") from None
            need = {"dicom_id", "category_name", "label_text", "x", "y", "w", "h", "image_width", "image_height"}
            if not need <= set(boxes.columns):
                raise MedclrError(f"{beside}: MS-CXR box table lacks columns {sorted(need - set(boxes.columns))}")
            if "phrase_id" not in boxes:
                boxes["phrase_id"] = boxes.groupby(["dicom_id", "label_text"], sort=False).ngroup()
            msrc = str(beside)
            mscxr = _attach_mscxr(df, boxes, msrc, notes)
        return with_labels(add_latent_classes(EvalData(df, mscxr, str(p), msrc, notes)))
    raise MedclrError(f"--data {str(p)!r}: no such file or directory (expected a manifest .parquet or a "
                      "MIMIC-CXR-JPG / CXR-Phantom root)")


def with_labels(data: EvalData) -> EvalData:
    """A corpus whose manifest holds no CheX5 label at all gets them from its reports (``medclr.data.labeller``,
    as `medclr label` writes them), with a note: zero-shot AUC then measures agreement with the report's words,
    not with a radiologist's or a labeller's reading of the image."""
    from medclr.data.labeller import RULES_NOTE, labels_or_rules

    data.manifest, filled = labels_or_rules(data.manifest, CHEX5)
    if filled:
        data.notes.append(f"no CheX5 labels in the manifest: {', '.join(filled)} {RULES_NOTE}")
    return data


def add_latent_classes(data: EvalData) -> EvalData:
    """CXR-Phantom: when the manifest lacks ``latent_class`` (``medclr prepare --mimic`` does not
    carry it), join it by ``dicom_id`` from ``phantom_ground_truth.parquet`` in the image root
    (:func:`medclr.data.groundtruth.attach_ground_truth`; rows it lacks get NaN). Optional: a
    table that cannot be joined only loses the latent-class probe, with a note."""
    gt = data.root / GROUND_TRUTH_FILE
    if "latent_class" in data.manifest.columns or not gt.is_file():
        return data
    try:
        data.manifest = attach_ground_truth(data.manifest, gt, columns=("latent_class", "latent_class_prob"), require="none")
    except MedclrError as exc:
        data.notes.append(f"{exc}; no latent-class probe")
        return data
    data.notes.append(f"latent classes (phantom ground truth) read from {gt}")
    return data


def top_classes(values: np.ndarray, k: int = 10, min_count: int = 5) -> list:
    """The ``k`` most frequent values seen at least ``min_count`` times (ties: by value)."""
    v = pd.Series(values).dropna().astype(str)
    counts = v[v != ""].value_counts()
    counts = counts[counts >= min_count]
    return sorted(counts.index, key=lambda c: (-counts[c], c))[:k]


# --------------------------------------------------------------------------- rows and labels


def split_rows(data: EvalData, split: str, max_images: int | None = None, seed: int = 0) -> np.ndarray:
    """Sorted manifest indices of ``split`` that have an image; a seeded sample of ``max_images``."""
    df = data.manifest
    if split not in ("train", "validate", "test"):
        raise MedclrError(f"--split {split!r}: expected train, validate or test")
    sel = (df["split"] == split) & (df["image_path"].astype(str) != "")
    rows = df.loc[sel, "index"].to_numpy(np.int64)
    if max_images is not None and 0 < max_images < rows.size:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=int(max_images), replace=False))
    return rows


def labels(data: EvalData, rows: np.ndarray, classes: list[str]) -> np.ndarray:
    """(N, C) float labels (CheXpert coding 1/0/-1/NaN) of manifest ``rows``."""
    missing = [c for c in classes if c not in data.manifest.columns]
    if missing:
        raise MedclrError(f"{data.source}: no label column(s) {missing} for the zero-shot classes")
    return data.manifest.loc[rows, list(classes)].to_numpy(np.float64)


def prompt_set(path: str | None):
    """A built-in set by name (``medclr.prompts.BUILTIN_PROMPTS``: paper, report), the user's prompt
    file (``medclr.evaluation.zeroshot.load_prompts``), else the paper's CheX5 prompts (the runner then takes
    the checkpoint's own set once the model is loaded)."""
    from medclr.evaluation.zeroshot import load_prompts
    from medclr.prompts import BUILTIN_PROMPTS, copy_prompts

    if path is None or path in BUILTIN_PROMPTS:
        return copy_prompts(BUILTIN_PROMPTS[path or "paper"])
    return load_prompts(path)


def has_two_label_values(y: np.ndarray) -> bool:
    """Some class has both a 1 and a 0 (so an AUC is defined)."""
    return bool(any(((y[:, j] == 1).any() and (y[:, j] == 0).any()) for j in range(y.shape[1])))


# --------------------------------------------------------------------------- phrases


@dataclass
class Phrases:
    """One row per MS-CXR phrase. ``boxes[k]`` is (n_k, 4) ``(x, y, w, h)`` in the pixels of the
    MS-CXR file (``image_width`` x ``image_height``); :meth:`boxes_for` rescales them to the image
    as it is read (MIMIC-CXR-JPG keeps the DICOM size, so usually a factor 1)."""

    table: pd.DataFrame  # phrase_id, index, dicom_id, text, category, image_width, image_height, split
    boxes: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.table)

    def boxes_for(self, k: int, height: int, width: int) -> np.ndarray:
        row = self.table.iloc[k]
        b = self.boxes[k].astype(np.float64).copy()
        b[:, [0, 2]] *= width / float(row["image_width"])
        b[:, [1, 3]] *= height / float(row["image_height"])
        return b


def phrases(data: EvalData, mscxr_split: str = "auto", max_phrases: int | None = None, seed: int = 0,
            rows: np.ndarray | None = None) -> Phrases:
    """Group MS-CXR boxes into phrases. ``mscxr_split``: "auto" keeps the phrases whose image is one
    of the evaluated manifest ``rows`` (no phrase on a training image); "all" keeps every phrase
    (the paper's 1,162 MS-CXR pairs, right when training excluded MS-CXR images, as BioViL's did);
    a split name filters on the MS-CXR file's own ``split`` column (v1.0.0 files are all "test")."""
    empty = Phrases(pd.DataFrame(columns=["phrase_id", "index", "dicom_id", "text", "category", "manifest_split"]), [])
    m = data.mscxr
    if m is None or m.empty:
        return empty
    if mscxr_split == "auto":
        m = m[np.isin(m["index"].to_numpy(), np.asarray(rows if rows is not None else [], dtype=np.int64))]
    elif mscxr_split != "all":
        m = m[m["split"].astype(str) == mscxr_split]
    groups = []
    for (dicom, text), g in m.groupby(["dicom_id", "label_text"], sort=False):
        first = g.iloc[0]
        groups.append(({"phrase_id": int(first["phrase_id"]), "index": int(first["index"]), "dicom_id": str(dicom),
                        "text": str(text), "category": str(first["category_name"]),
                        "image_width": float(first["image_width"]), "image_height": float(first["image_height"]),
                        "split": str(first.get("split", ""))}, g[["x", "y", "w", "h"]].to_numpy(np.float64)))
    if max_phrases is not None and 0 < max_phrases < len(groups):
        keep = np.sort(np.random.default_rng(seed).choice(len(groups), size=int(max_phrases), replace=False))
        groups = [groups[i] for i in keep]
    if not groups:
        return empty
    table = pd.DataFrame([g[0] for g in groups])
    table["manifest_split"] = data.manifest["split"].to_numpy()[table["index"].to_numpy(np.int64)]
    return Phrases(table.reset_index(drop=True), [g[1] for g in groups])


def control_pairs(ph: Phrases, seed: int) -> np.ndarray:
    """For each phrase, another phrase from a different image with a different text (seeded)."""
    n = len(ph)
    idx, text = ph.table["index"].to_numpy(), ph.table["text"].to_numpy()
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    for _ in range(50):
        bad = np.flatnonzero((idx[perm] == idx) | (text[perm] == text))
        if bad.size == 0:
            break
        for k in bad:
            j = int(rng.integers(n))
            perm[k], perm[j] = perm[j], perm[k]
    return perm


# --------------------------------------------------------------------------- model adapter


TRAINING_FIELDS = ("loss", "step", "total_steps", "global_batch", "n_train", "last_loss", "manifest")


class Model:
    """The few things evaluation needs from ``medclr.inference`` (one place to adapt)."""

    def __init__(self, checkpoint: str | Path, device: str = "cpu") -> None:
        from medclr.inference import load_checkpoint

        self.engine = load_checkpoint(checkpoint, device=device)
        self.model, self.pre, self.device = self.engine.model, self.engine.preprocess, self.engine.device
        self.meta, self.tau = self.engine.meta, self.engine.tau

    def describe(self) -> dict[str, Any]:
        head = self.model.head.to_config() if hasattr(self.model.head, "to_config") else {}
        # what training recorded: the loss, how far it got, on which manifest (none for a hand-made checkpoint)
        training = {k: getattr(self.meta, k) for k in TRAINING_FIELDS
                    if getattr(self.meta, k) is not None} if self.meta.step is not None else {}
        return {"training": training,
                "preprocess": {"image_size": int(self.pre.image_size), "resize": int(self.pre.resize_to),
                               "source": self.meta.source.get("image_size")},
                "head": head, "joint_dim": int(self.model.joint_dim),
                "image_arch": getattr(self.model.image_encoder, "arch", None)}

    def geometry(self, height: int, width: int) -> G.CropGeometry:
        return G.CropGeometry.from_resize_crop((int(height), int(width)), self.pre.resize_to, int(self.pre.image_size))

    def loader(self, paths: list[str], batch_size: int, workers: int):
        from medclr.inference import image_loader

        return image_loader(paths, self.pre, batch_size=batch_size, num_workers=workers)

    @torch.inference_mode()
    def features(self, batch: torch.Tensor) -> ImageFeatures:
        return self.engine.image_features(batch)

    def zero_shot(self, feats: ImageFeatures, prompts) -> tuple[np.ndarray, np.ndarray]:
        _classes, _prob, s_pos, s_neg = self.engine.zero_shot_scores(feats, prompts)
        return s_pos, s_neg

    def prompt_embeddings(self, prompts) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """class -> (positive, negative) unit (D,) prompt-set embeddings, reduced as the zero-shot scores reduce them."""
        return {c: (p.float().cpu().numpy(), n.float().cpu().numpy())
                for c, (p, n) in self.engine.prompt_embeddings(prompts).items()}

    @torch.inference_mode()
    def texts(self, sentences: list[str]) -> torch.Tensor:
        return torch.from_numpy(self.engine.embed_texts(list(sentences))).to(self.device)

    def _image(self, regions: torch.Tensor) -> ImageFeatures:
        """One image's features from its kept regions (D, h, w); the global embedding is their normalised mean."""
        r = regions[None].to(self.device)
        return ImageFeatures(r, torch.nn.functional.normalize(r.mean((2, 3)), dim=-1))

    @torch.inference_mode()
    def region_scores(self, regions: torch.Tensor, text: torch.Tensor) -> np.ndarray:
        """(T, h, w) region-sentence cosines of one image's regions (D, h, w)."""
        return self.model.region_scores(self._image(regions), text).float()[0].cpu().numpy()

    @torch.inference_mode()
    def scores(self, regions: torch.Tensor, text: torch.Tensor) -> np.ndarray:
        """(T,) image-sentence scores of one image (``DualEncoder.similarity``: what the loss trains, what the app's
        side and size checks compare)."""
        return self.model.similarity(self._image(regions), text).float()[0].cpu().numpy()

    @torch.inference_mode()
    def compared_regions(self, regions: torch.Tensor) -> torch.Tensor:
        """The region features the head compares with sentences (non-local block for LSE+NL)."""
        ctx = getattr(self.model.head, "contextualize", None)
        r = regions.to(self.device)
        return (ctx(r) if ctx is not None else r).float()


# --------------------------------------------------------------------------- encoding pass


@dataclass
class Encoded:
    rows: np.ndarray  # manifest indices encoded without error, sorted
    glob: np.ndarray  # (N, D) unit global embeddings, in ``rows`` order
    s_pos: np.ndarray | None  # (N, C) zero-shot scores with the positive / negative prompt sets
    s_neg: np.ndarray | None
    regions: dict[int, torch.Tensor] = field(default_factory=dict)  # index -> (D, h, w)
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> original (H, W)
    failed: list[dict[str, Any]] = field(default_factory=list)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Positions (in ``self.rows``) of the requested manifest rows that were encoded."""
        pos = np.searchsorted(self.rows, rows)
        ok = (pos < self.rows.size) & (self.rows[np.minimum(pos, self.rows.size - 1)] == rows)
        return pos[ok]


def encode(model: Model, data: EvalData, rows: np.ndarray, keep_regions: set[int], prompts, batch_size: int,
           workers: int, progress: bool | str = "auto") -> Encoded:
    rows = np.unique(rows)
    paths = [data.image_path(i) for i in rows]
    glob, pos, neg, ok_rows, failed = [], [], [], [], []
    regions: dict[int, torch.Tensor] = {}
    sizes: dict[int, tuple[int, int]] = {}
    bar = progress_bar(total=len(paths), desc="encode images", unit="img", enabled=progress)
    for batch in model.loader(paths, batch_size, workers):
        ok = batch["ok"].numpy()
        idx = rows[batch["i"].numpy()]
        for i, good, err in zip(idx, ok, batch["error"]):
            if not good:
                failed.append({"index": int(i), "path": data.image_path(i), "error": err})
        if ok.any():
            feats = model.features(batch["tensor"][torch.from_numpy(ok)])
            finite = feats.global_emb.isfinite().all(dim=1).cpu().numpy()
            if not finite.all():  # NaN/inf: a failed image with its reason, never a score in the metrics
                from medclr.inference.engine import NON_FINITE

                failed += [{"index": int(i), "path": data.image_path(i), "error": NON_FINITE}
                           for i in idx[ok][~finite]]
                keep = torch.from_numpy(finite)
                feats = ImageFeatures(feats.regions[keep.to(feats.regions.device)],
                                      feats.global_emb[keep.to(feats.global_emb.device)])
                ok = ok.copy()
                ok[np.flatnonzero(ok)[~finite]] = False
                if not ok.any():
                    bar.update(len(idx))
                    continue
            glob.append(feats.global_emb.float().cpu().numpy())
            if prompts is not None:
                sp, sn = model.zero_shot(feats, prompts)
                pos.append(sp)
                neg.append(sn)
            good_idx = idx[ok]
            hs = np.asarray(batch["height"])[ok]
            ws = np.asarray(batch["width"])[ok]
            for j, i in enumerate(good_idx):
                sizes[int(i)] = (int(hs[j]), int(ws[j]))
                if int(i) in keep_regions:
                    regions[int(i)] = feats.regions[j].float().cpu().clone()
            ok_rows.append(good_idx)
        bar.update(len(idx))
    bar.close()
    if failed:
        log.warning("%d image(s) could not be read and were left out (first: %s)", len(failed), failed[0]["error"])
    cat = (lambda xs: np.concatenate(xs) if xs else None)  # noqa: E731
    d = model.model.joint_dim
    return Encoded(np.concatenate(ok_rows) if ok_rows else np.zeros(0, np.int64),
                   cat(glob) if glob else np.zeros((0, d), np.float32), cat(pos), cat(neg), regions, sizes, failed)


__all__ = ["EvalData", "Encoded", "Model", "encode", "Phrases", "add_latent_classes", "control_pairs",
           "has_two_label_values", "labels", "load_eval_data", "phrases", "prompt_set", "split_rows", "top_classes"]
