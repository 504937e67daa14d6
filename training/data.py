"""Training data: manifest rows -> (image crop, one report sentence, dataset index, eta) batches.

* The unit of text is one sentence: every step draws one sentence of the pair's report (as the
  debiasing and BioViL papers do), and the pair's eta is that sentence's eta. The draw is uniform
  or (``data.sentence_sampling: findings``) weighted towards the sentences that state a finding.
  Which reports a batch holds is the sampler's (``training.sampler``): each once per epoch, or
  (``data.study_sampling: findings``) drawn with :func:`study_weights`, rare findings more often.
* Images: the deterministic part (read with medclr.io.read_image, resize the shorter side) is
  cached by ``monai.data.CacheDataset``; the random part (crop, brightness, contrast, gamma)
  runs after the cache, the intensity part in the loader or, with ``data.augment_on: device``,
  batched on the training device from per-item parameters (training/augment.py). No flips:
  reports name the side ("right pleural effusion"). The resize
  and the deterministic (validation) centre crop are ``medclr.geometry``'s, the rule inference
  and evaluation use.
* Exact resume: all data randomness is a pure function of (seed, epoch, dataset index), so it
  does not depend on the number of loader workers, their seeds, or where a run was resumed.
  The sampler yields (epoch, index) keys and the dataset derives its RNGs from them (weighted
  draws yield (step, index): a row can come back within an epoch, with a new view).
* "Dataset index" = the row's position 0..n-1 in the training split (the per-sample loss
  tables are sized n); ``TrainTable.manifest_index`` maps it back to the manifest's ``index``.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from medclr.data.hard_negatives import hard_negatives, short_form
from medclr.data.pairs import sentence_probabilities
from medclr.errors import MedclrError
from medclr.geometry import centre_crop, resize_shorter_side
from medclr.training.augment import drawn_parameters, unit_float

log = logging.getLogger(__name__)

_DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}


@dataclass
class TrainTable:
    """The rows of one split that can be trained on."""

    paths: list[str]                # absolute image paths
    sentences: list[list[str]]
    eta: list[np.ndarray] | None    # per row: eta per sentence, or one value (study_prior); None = no eta
    manifest_index: np.ndarray      # manifest `index` of each row
    labels: np.ndarray | None       # CheX5 labels (rows x 5) for validation, else None
    fingerprint: str                # identifies the rows (resume checks it)
    short_texts: list[str] = field(default_factory=list)  # the short forms a step may show (data.short_form > 0)
    text_eta: dict[str, float] | None = None  # eta of every text a step may show, where eta belongs to the text

    def __len__(self) -> int:
        return len(self.paths)

    @cached_property
    def texts(self) -> list[str]:
        """The distinct texts a step may show (the rows' sentences and their short forms), sorted: ``text_ids``
        index into it."""
        return sorted({s for row in self.sentences for s in row}.union(self.short_texts))

    @cached_property
    def text_position(self) -> dict[str, int]:
        """Text -> its position in :attr:`texts` (the key of sentence-keyed tables: NUCLR's text popularity with
        ``loss.zeta_key: sentence``)."""
        return {s: i for i, s in enumerate(self.texts)}

    @cached_property
    def text_ids(self) -> list[np.ndarray]:
        """Per row, the position of each of its sentences in :attr:`texts`."""
        pos = self.text_position
        return [np.array([pos[s] for s in row], dtype=np.int64) for row in self.sentences]

    def shown_eta(self, i: int, j: int, shown: str) -> float | None:
        """The eta of a step that draws sentence j of row i and shows ``shown`` (the sentence, or a short form
        of it): the shown text's own where eta belongs to the text, else the row's (the study's prior)."""
        if self.eta is None:
            return None
        if self.text_eta is not None:
            return float(self.text_eta[shown])
        e = self.eta[i]
        return float(e[j] if e.shape[0] > 1 else e[0])


def _fingerprint(df) -> str:
    h = hashlib.sha1()
    for idx, path, sents in zip(df["index"], df["image_path"], df["sentences"]):
        h.update(f"{int(idx)}\t{path}\t{len(sents)}\n".encode())
    return h.hexdigest()[:16]


def read_manifest_split(manifest: str | Path, split: str):
    """(manifest rows of `split` that have an image and at least one sentence, the full manifest)."""
    from medclr.data.manifest import read_manifest

    df = read_manifest(Path(manifest).expanduser())
    rows = df[df["split"] == split]
    if rows.empty:
        raise MedclrError(f"{manifest}: no rows with split == {split!r} (splits: {sorted(set(df['split']))})")
    usable = rows[(rows["image_path"].astype(str) != "") & (rows["sentences"].map(len) > 0)]
    if len(usable) < len(rows):
        log.info("%s split %s: %d of %d rows have no image or no sentence and are skipped",
                 manifest, split, len(rows) - len(usable), len(rows))
    if usable.empty:
        raise MedclrError(f"{manifest}: split {split!r} has no row with both an image and a sentence")
    return usable.reset_index(drop=True), df


def _eta_from_table(rows, cfg: dict, texts: list[str]) -> dict[str, float]:
    """eta_LM of every text a step may show, from the eta table (``medclr lm score`` scores the short forms too)."""
    from medclr.data.text import sentence_hash
    from medclr.lm.eta import apply_eta, join_eta, read_eta_table

    path = Path(cfg["data"]["eta"]).expanduser()
    table, meta = read_eta_table(path)
    if cfg["data"]["eta_a"] is not None:
        table, clipped = apply_eta(table, a=float(cfg["data"]["eta_a"]), k=float(cfg["data"]["eta_k"]),
                                   norm=meta.get("norm", "sum"), eta_max=float(cfg["data"]["eta_max"]))
        log.info("eta recomputed from pll with a=%s, k=%s (%d clipped at %s)", cfg["data"]["eta_a"],
                 cfg["data"]["eta_k"], clipped, cfg["data"]["eta_max"])
    try:
        join_eta(rows, table)  # every manifest sentence in the table, with a value (its one-line errors)
    except MedclrError as exc:
        raise MedclrError(f"eta table {str(path)!r}: {exc}") from None
    by_hash = table.drop_duplicates("sentence_hash").set_index("sentence_hash")["eta"]
    values = by_hash.reindex([sentence_hash(t) for t in texts]).to_numpy(dtype=np.float64)
    if np.isnan(values).any():
        first = texts[int(np.flatnonzero(np.isnan(values))[0])]
        raise MedclrError(f"eta table {str(path)!r} has no eta for the short form {first!r} that data.short_form may "
                          "show; score the manifest again with this version of `medclr lm score` (it adds them)")
    if values.size and (values.min() < 0 or values.max() >= 1):
        raise MedclrError(f"eta table {str(path)!r}: eta must lie in [0, 1) for every sentence "
                          f"(found min {values.min():.3g}, max {values.max():.3g})")
    return dict(zip(texts, values.tolist()))


def _sampling(cfg: dict) -> dict:
    """The training config's draws, as ``medclr.data.pairs.pair_probabilities`` takes them."""
    d = cfg["data"]
    return {"sentence_sampling": d["sentence_sampling"], "other_weight": float(d["other_sentence_weight"]),
            "study_sampling": d["study_sampling"], "study_balance": float(d["study_balance"])}


def _eta_true(rows, cfg: dict, texts: list[str], manifest: str) -> dict[str, float]:
    """DCL's oracle for every text a step may show: its false-negative rate q, the probability that a negative
    image drawn as this run's sampler draws studies is one the text is true of
    (``medclr.phantom.sentence_keys.false_negative_rate``), capped at data.eta_max like any eta."""
    from medclr.data.pairs import study_weights
    from medclr.phantom.sentence_keys import false_negative_rate, sentence_key

    if "latent_class" not in rows:
        raise MedclrError(f"{manifest}: loss.eta_source=true needs the manifest column 'latent_class' (CXR-Phantom "
                          "ground truth: medclr.data.groundtruth.attach_ground_truth)")
    sentences = [list(s) for s in rows["sentences"]]
    d = cfg["data"]
    w = study_weights(sentences, d["study_sampling"], float(d["study_balance"]))
    p = np.full(len(sentences), 1.0 / len(sentences)) if w is None else w / w.sum()
    report_keys = [frozenset(sentence_key(s) for s in row) for row in sentences]
    q = false_negative_rate([sentence_key(t) for t in texts], rows["latent_class"].astype(str).tolist(), report_keys, p)
    cap = float(d["eta_max"])
    return {t: min(q[sentence_key(t)], cap) for t in texts}


def _eta_rho_sent(rows, cfg: dict, texts: list[str]) -> dict[str, float]:
    """rho_sent for every text a step may show: how often its ground-truth key occurs among the training pairs as
    this run's sampler draws them (``medclr.phantom.sentence_keys.rho_sent``; not DCL's false-negative rate)."""
    from medclr.data.pairs import key_frequency, pair_probabilities
    from medclr.phantom.sentence_keys import sentence_key

    sentences = [list(s) for s in rows["sentences"]]
    keys = [[sentence_key(s) for s in row] for row in sentences]
    freq = {}
    for row_keys, row_f in zip(keys, key_frequency(keys, pair_probabilities(sentences, **_sampling(cfg)))):
        freq.update(zip(row_keys, row_f.tolist()))
    cap = float(cfg["data"]["eta_max"])
    return {t: min(freq.get(sentence_key(t), 0.0), cap) for t in texts}


def _eta_study_prior(rows, manifest: str) -> list[np.ndarray]:
    """The study's latent-class prior (one value for every sentence of the study): the oracle before rho_sent,
    kept to compare with it."""
    col = "latent_class_prob"
    if col not in rows:
        raise MedclrError(f"{manifest}: loss.eta_source=study_prior needs the manifest column {col!r} "
                          "(CXR-Phantom ground truth: medclr.data.groundtruth.attach_ground_truth)")
    p = rows[col].to_numpy(dtype=np.float64)
    if np.isnan(p).any() or p.min() < 0 or p.max() >= 1:
        raise MedclrError(f"{manifest}: column {col!r} must hold class probabilities in [0, 1) on every training row")
    return [np.asarray([v], dtype=np.float32) for v in p]


def load_table(cfg: dict, split: str | None = None, eta: bool = True) -> TrainTable:
    """The training (or validation) rows of the configured manifest, with eta when the loss needs it."""
    from medclr.data.labels import CHEX5

    manifest = cfg["data"]["manifest"]
    split = split or cfg["data"]["split"]
    rows, _ = read_manifest_split(manifest, split)
    root = Path(rows.attrs.get("root", "") or "")
    paths = [str(root / p) for p in rows["image_path"]]
    src = cfg["loss"]["eta_source"] if eta else "none"
    sentences = [list(s) for s in rows["sentences"]]
    short = _short_texts(sentences) if float(cfg["data"]["short_form"]) > 0 and split == cfg["data"]["split"] else []
    texts = sorted({s for row in sentences for s in row}.union(short))
    eta_rows, text_eta = None, None
    if src == "lm":
        text_eta = _eta_from_table(rows, cfg, texts)
    elif src == "true":
        text_eta = _eta_true(rows, cfg, texts, manifest)
    elif src == "rho_sent":
        text_eta = _eta_rho_sent(rows, cfg, texts)
    elif src == "study_prior":
        eta_rows = _eta_study_prior(rows, manifest)
    if text_eta is not None:
        eta_rows = [np.array([text_eta[s] for s in row], dtype=np.float32) for row in sentences]
    labels = None
    if all(c in rows for c in CHEX5):
        labels = rows[list(CHEX5)].to_numpy(dtype=np.float64)
    return TrainTable(paths=paths, sentences=sentences, eta=eta_rows, manifest_index=rows["index"].to_numpy(dtype=np.int64),
                      labels=labels, fingerprint=_fingerprint(rows), short_texts=short, text_eta=text_eta)


def _short_texts(sentences: list[list[str]]) -> list[str]:
    """Every short form a step may show in place of these sentences (``data.short_form``), not already one of them."""
    from medclr.data.hard_negatives import short_forms

    distinct = {s for row in sentences for s in row}
    return sorted({f for s in distinct for f in short_forms(s)} - distinct)


def check_images_exist(table: TrainTable, manifest: str) -> None:
    missing = [p for p in table.paths if not Path(p).is_file()]
    if missing:
        raise MedclrError(f"{manifest}: {len(missing)} of {len(table)} images are missing (first: {missing[0]}); "
                          "is the manifest's image root still there?")


# --------------------------------------------------------------------------- transforms


def cache_mode(value) -> str:
    """data.cache: ram (CacheDataset, every image in memory), disk (PersistentDataset, one .pt per
    image, for sets too large for RAM or shared by runs), none (read + resize at every access)."""
    mode = {True: "ram", False: "none", None: "none"}.get(value, value) if isinstance(value, (bool, type(None))) \
        else str(value).lower()
    if mode not in ("ram", "disk", "none"):
        raise MedclrError(f"config data.cache {value!r}: expected ram, disk or none")
    return mode


def load_resized(image, resize: int, cache_dtype: str = "float32") -> torch.Tensor:
    """A radiograph (a path for medclr.io.read_image: [0, 1], air dark; or such an H x W array) with its
    shorter side resized to ``resize`` (``medclr.geometry.resize_shorter_side``, the rule inference and
    evaluation use), 1 x H' x W' in ``cache_dtype``."""
    from medclr.io import read_image
    from medclr.io.limits import blank_problem

    img = np.asarray(image, dtype=np.float32) if isinstance(image, np.ndarray) else read_image(image)
    if not isinstance(image, np.ndarray) and (blank := blank_problem(img)):
        _note_blank(str(image), blank)
    x = resize_shorter_side(torch.from_numpy(np.ascontiguousarray(img))[None], resize).clamp_(0.0, 1.0)
    if cache_dtype == "uint8":
        return (x * 255.0).round_().to(torch.uint8)
    return x.to(_DTYPES[cache_dtype])


_BLANK: dict[str, str] = {}  # path -> why, for each blank image this process has read


def _note_blank(path: str, problem: str) -> None:
    """Logged once per image and process (data.cache none reads every image at every epoch), and remembered for
    the data-quality summary."""
    if path not in _BLANK:
        _BLANK[path] = problem
        log.warning("training image %s: %s; it trains as it is (medclr score and eval refuse it)", path, problem)


def _load_resize_transform(resize: int, cache_dtype: str):
    from monai.transforms import MapTransform

    class LoadRadiographd(MapTransform):
        """Read a radiograph and resize its shorter side (:func:`load_resized`).

        A MONAI Transform (not a plain function) so that CacheDataset caches its output: the
        cache stops at the first item that is random *or not a Transform*.
        """

        def __init__(self) -> None:
            super().__init__(keys=("image",))

        def __call__(self, item: dict) -> dict:
            image = load_resized(item["image"], resize, cache_dtype)
            return {**item, "image": image, "checksum": pixel_checksum(image)}

    return LoadRadiographd()


def pixel_checksum(image: torch.Tensor) -> int:
    """CRC-32 of a cached image's bytes: stored with it, checked when the disk cache serves it."""
    import zlib

    return zlib.crc32(image.contiguous().view(torch.uint8).numpy().tobytes())


def source_identity(path: str) -> str:
    """What identifies a source image's content for the disk cache's key: its size and modification time
    (a file replaced in place gets a new key, so a stale cache entry is never served)."""
    try:
        st = Path(path).stat()
    except OSError:
        return "missing"  # the read below raises its one line
    return f"{st.st_size}-{st.st_mtime_ns}"


def verified_persistent_dataset(items, transform, cache_dir: Path):
    """MONAI's PersistentDataset whose entries are checked on read: an entry that does not load or whose pixels
    do not match the checksum stored with them (bit rot, a truncated write, an edit) is deleted and rebuilt
    from the source with one log line, never trained on."""
    from monai.data import PersistentDataset

    class VerifiedPersistentDataset(PersistentDataset):
        def _cachecheck(self, item_transformed):
            path = self.cache_dir / f"{self.hash_func(item_transformed).decode('utf-8')}{self.transform_hash}.pt"
            if path.is_file():
                try:
                    cached = torch.load(path, weights_only=True)
                    if pixel_checksum(cached["image"]) == cached["checksum"]:
                        return cached
                    why = "its pixels do not match the checksum stored with them"
                except Exception as exc:  # noqa: BLE001 - any unreadable entry is rebuilt
                    why = f"unreadable ({type(exc).__name__})"
                log.warning("image cache entry %s: %s; rebuilt from %s", path.name, why, item_transformed["image"])
                path.unlink(missing_ok=True)
            return super()._cachecheck(item_transformed)

    return VerifiedPersistentDataset(items, transform=transform, cache_dir=cache_dir)


def _random_transform(crop: int, aug: dict):
    from monai.transforms import (
        Compose,
        RandAdjustContrast,
        RandScaleIntensityFixedMean,
        RandShiftIntensity,
        RandSpatialCrop,
    )

    prob = float(aug.get("prob", 0.5))
    ts = [RandSpatialCrop(roi_size=(crop, crop), random_size=False)]
    if aug.get("brightness"):
        ts.append(RandShiftIntensity(offsets=float(aug["brightness"]), prob=prob))
    if aug.get("contrast"):
        ts.append(RandScaleIntensityFixedMean(factors=float(aug["contrast"]), prob=prob))
    if aug.get("gamma"):
        ts.append(RandAdjustContrast(gamma=tuple(float(g) for g in aug["gamma"]), prob=prob))
    return Compose(ts)


def _plain(x) -> torch.Tensor:
    # MONAI returns MetaTensors; batches of plain tensors are cheaper to collate and pin.
    return x.as_tensor() if hasattr(x, "as_tensor") else torch.as_tensor(x)


class PairDataset(torch.utils.data.Dataset):
    """Cached images + sentences. ``ds[(epoch, i)]`` is a random training view of pair i
    (``(step, i)`` under weighted draws);
    ``ds[i]`` (an int) is the deterministic view (centre crop, first sentence) for evaluation.

    ``device_augment``: training views are the crop in the cache's dtype plus ``item["augment"]``,
    the intensity parameters for ``training.augment.apply_on_device`` (drawn from the same streams)."""

    def __init__(self, table: TrainTable, cfg: dict, cache_progress: bool = False,
                 device_augment: bool = False) -> None:
        from monai.data import CacheDataset
        from monai.transforms import Compose

        self.table, self.seed, self.device_augment = table, int(cfg["seed"]), device_augment
        d = cfg["data"]
        self.sentence_p = sentence_probabilities(table.sentences, d["sentence_sampling"], float(d["other_sentence_weight"]))
        hn = cfg["hard_negatives"]
        self.hard_kinds = tuple(hn["kinds"]) if float(hn["weight"]) > 0 else ()
        self.short_form = float(d["short_form"])
        self.crop = int(d["crop"])
        self.random = _random_transform(self.crop, d.get("aug") or {})
        # resize/dtype and the source file's identity ride along in each item so that the disk cache's key (a
        # hash of the item) changes when they do; PersistentDataset would otherwise serve stale images.
        mode = cache_mode(d["cache"])
        self.cached_up_front = mode == "ram"
        items = [{"image": p, "resize": int(d["resize"]), "dtype": d["cache_dtype"],
                  "source": source_identity(p) if mode == "disk" else ""} for p in table.paths]
        load = Compose([_load_resize_transform(int(d["resize"]), d["cache_dtype"])])
        try:
            if mode == "disk":
                cache_dir = Path(d["cache_dir"] or Path(cfg["out"]) / "image_cache").expanduser()
                cache_dir.mkdir(parents=True, exist_ok=True)
                self.images = verified_persistent_dataset(items, load, cache_dir)
            else:
                self.images = CacheDataset(items, transform=load, cache_rate=1.0 if mode == "ram" else 0.0,
                                           num_workers=int(d["cache_workers"]), progress=cache_progress,
                                           copy_cache=False)
        except Exception as exc:  # MONAI wraps a failed read in RuntimeError: surface our one line
            cause = exc
            while cause is not None and not isinstance(cause, MedclrError):
                cause = cause.__cause__ or cause.__context__
            if cause is not None:
                raise MedclrError(f"caching training images: {cause}") from None
            raise

    def blank_images(self) -> int | None:
        """How many training images are blank, once every image has been read (data.cache ram reads them all here,
        before the first step); None where they are read as training visits them, perhaps in loader workers."""
        return sum(p in _BLANK for p in self.table.paths) if self.cached_up_front else None

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            epoch, i = int(key[0]), int(key[1])
            j, sentence, rng, t_seed = self._draw_sentence(epoch, i)
            hard = hard_negatives(sentence, self.table.sentences[i], self.hard_kinds,
                                  pick=lambda n: int(rng.integers(n))) if self.hard_kinds else []
            img, augment = self._training_view(i, int(t_seed))
        else:
            i, j, hard, augment = int(key), 0, [], None
            sentence = self.table.sentences[i][j]
            img = centre_crop(_plain(unit_float(self.images[i]["image"])), self.crop)
        # eta and the text index follow the text shown: a short form is a sentence of its own
        item = {"image": img.contiguous(), "sentence": sentence, "index": i, "eta": self.table.shown_eta(i, j, sentence),
                "hard": hard, "text_index": self.table.text_position[sentence]}
        return item if augment is None else {**item, "augment": augment}

    def training_sentence(self, epoch: int, i: int) -> tuple[int, str]:
        """(j, text) of the sentence that training view (epoch, i) pairs with image i, without
        reading the image: which report sentence a visit drew (bench/paper_replication.py keys
        NUCLR's per-sample popularity by it)."""
        j, sentence, _, _ = self._draw_sentence(int(epoch), int(i))
        return j, sentence

    def _draw_sentence(self, epoch: int, i: int) -> tuple[int, str, np.random.Generator, int]:
        # Two independent streams per (seed, epoch, item): the sentence and the image view.
        s_seed, t_seed = np.random.SeedSequence([self.seed, epoch, i]).generate_state(2)
        rng = np.random.default_rng(int(s_seed))
        p = None if self.sentence_p is None else self.sentence_p[i]
        j = int(rng.integers(len(self.table.sentences[i])) if p is None else rng.choice(len(p), p=p))
        sentence = self.table.sentences[i][j]
        if self.short_form > 0 and rng.random() < self.short_form:
            sentence = short_form(sentence, pick=lambda n: int(rng.integers(n))) or sentence
        return j, sentence, rng, int(t_seed)

    def _training_view(self, i: int, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(random crop, None) augmented here, or (crop in the cache's dtype, its intensity parameters)."""
        self.random.set_random_state(seed=seed)  # one stream per transform, as Compose seeds them
        if not self.device_augment:
            return _plain(self.random(unit_float(self.images[i]["image"]))).clamp_(0.0, 1.0), None
        crop, *intensity = self.random.transforms
        return _plain(crop(torch.as_tensor(self.images[i]["image"]))), drawn_parameters(intensity)


class Collate:
    """List of items -> batch; tokenises here (in the loader workers) with the text encoder's own rules.

    Items may carry hard negative texts (``item["hard"]``, made by the dataset with
    ``medclr.data.hard_negatives``): ``tokens`` then holds the B sentences followed by every hard
    negative (one tokenisation, one padding), and ``hard_index`` says which pair each belongs to."""

    def __init__(self, text_encoder) -> None:
        # Only what TextEncoder.tokenize reads, so the collate pickles without the model.
        self.proxy = SimpleNamespace(tokenizer=text_encoder.tokenizer, max_length=text_encoder.max_length,
                                     strip_punctuation=text_encoder.strip_punctuation)

    def __call__(self, items: list[dict]) -> dict:
        from medclr.models.text import TextEncoder

        sentences = [it["sentence"] for it in items]
        etas = [it["eta"] for it in items]
        hard = [(i, text) for i, it in enumerate(items) for text in it.get("hard", ())]
        return {
            "images": torch.stack([it["image"] for it in items]),
            "augment": torch.stack([it["augment"] for it in items]) if "augment" in items[0] else None,
            "tokens": TextEncoder.tokenize(self.proxy, sentences + [text for _, text in hard]),
            "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
            "text_index": torch.tensor([it["text_index"] for it in items], dtype=torch.long),
            "eta": None if any(e is None for e in etas) else torch.tensor(etas, dtype=torch.float32),
            "sentences": sentences,
            "hard_index": torch.tensor([i for i, _ in hard], dtype=torch.long),
        }
