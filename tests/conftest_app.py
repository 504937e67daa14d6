"""Shared fixtures for the index, app and scoring tests (import them; pytest does not auto-load this file).

A small but real checkpoint, built here without training: a tiny BERT masked LM with a WordPiece
tokenizer trained on a few report sentences, a ResNet-18 trunk (random init), joint dim 32, the
LSE+NL head, saved with ``DualEncoder.save_pretrained``; plus the side files a trained checkpoint
has (checkpoint_meta.json naming an eta table, loss_state.safetensors with NUCLR zeta).
And a small manifest of image-report pairs whose images are PNGs drawn here and the real RG1 DICOM.
Builders are memoised per base temp dir, so importing the fixtures into several modules builds once.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from medclr.app.background import free_port, serve_in_background  # noqa: F401 - the tests import free_port from here

SENTENCES = [
    "There is a small left pleural effusion.",
    "No pneumothorax.",
    "Heart size is normal.",
    "Mild cardiomegaly is seen.",
    "The lungs are clear without focal consolidation.",
    "Right lower lobe opacity may represent pneumonia.",
    "No acute cardiopulmonary process.",
    "Pulmonary edema is present.",
    "Findings suggesting pneumonia.",
    "No signs of pneumonia.",
    "No pleural effusions.",
    "Stable appearance of the mediastinum.",
]
N_STUDIES = 12


def rg1_path(name: str = "RG1_UNCI.dcm") -> str:
    from pydicom.data import get_testdata_file

    path = get_testdata_file(name)
    if path is None:
        pytest.skip(f"pydicom-data is not installed ({name} missing)")
    return str(path)


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    # the vocabulary by hand: every word of SENTENCES whole, and its characters for other words. The WordPiece
    # trainer breaks ties in hash-map order, a different vocabulary (and test model) in every process.
    normalizer, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = sorted({w for s in SENTENCES for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(s))})
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789"))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(dict.fromkeys(words + chars)) + [f"##{c}" for c in chars]
    tk = Tokenizer(models.WordPiece(vocab={t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tk.normalizer, tk.pre_tokenizer, tk.decoder = normalizer, pre, decoders.WordPiece()
    cls_id, sep_id = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return BertTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")


@functools.cache
def build_text_model(root: str) -> Path:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    d = Path(root) / "text_lm"
    if (d / "config.json").is_file():
        return d
    tok = _tokenizer()
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    BertForMaskedLM(cfg).save_pretrained(d)
    return d


def make_checkpoint(out: Path, text_dir: Path, seed: int = 0, image_size: int = 224, n_samples: int = N_STUDIES,
                    eta_table: Path | None = None) -> Path:
    """A DualEncoder checkpoint dir (+ checkpoint_meta.json, loss_state.safetensors)."""
    import torch
    from safetensors.torch import save_file

    from medclr.inference import CheckpointMeta, weights_sha256, write_metadata
    from medclr.models.dual import build_dual_encoder

    torch.manual_seed(seed)
    model = build_dual_encoder(text_dir, arch="resnet18", joint_dim=32, head="lse_nl", image_pretrained="none")
    model.head.trained = True  # stands for a trained checkpoint (an untrained lse_nl head is refused)
    model.save_pretrained(out)
    trained = {"loss": "nuclr", "tau": 0.05, "eta_table": str(eta_table)} if eta_table is not None else {}
    # as training writes it: with the SHA-256 of the weights beside it (a format-3 record without it is refused)
    write_metadata(out, CheckpointMeta(image_size=image_size, resize=image_size, weights_sha256=weights_sha256(out),
                                       **trained))
    g = torch.Generator().manual_seed(seed)
    # training rows are stored in their own order: position i holds manifest index n - 1 - i here
    save_file({"loss.zeta_txt": torch.randn(n_samples, generator=g) * 0.1,
               "loss.zeta_img": torch.randn(n_samples, generator=g) * 0.1,
               "loss.u_txt": torch.zeros(n_samples),
               "sample_manifest_index": torch.arange(n_samples - 1, -1, -1)}, str(out / "loss_state.safetensors"))
    return out


def _draw_cxr(rng: np.random.Generator, size: int = 96) -> np.ndarray:
    """A crude chest-like PNG: dark lungs, bright mediastinum, a random blob (enough for plumbing)."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = 0.75 - 0.45 * (np.exp(-((xx - 0.3) ** 2 / 0.02 + (yy - 0.5) ** 2 / 0.08))
                         + np.exp(-((xx - 0.7) ** 2 / 0.02 + (yy - 0.5) ** 2 / 0.08)))
    cx, cy = rng.uniform(0.2, 0.8, 2)
    img += 0.3 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.005)
    img += rng.normal(0, 0.03, img.shape)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def synthetic_test_manifest(base: Path, n: int, seed: int, prefix: str) -> Path:
    """``n`` drawn 64 px films (test split, one study and subject each, two of SENTENCES as the report) under
    ``base/images``, written as ``base/manifest.parquet``."""
    import pandas as pd
    from PIL import Image

    from medclr.data.manifest import write_manifest

    images = base / "images"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        rel = f"{prefix}{i:03d}.png"
        Image.fromarray(_draw_cxr(rng, 64)).save(images / rel)
        sents = [SENTENCES[i % len(SENTENCES)], SENTENCES[(i * 7 + 2) % len(SENTENCES)]]
        rows.append({"subject_id": f"2{i:03d}", "study_id": f"6{i:04d}", "dicom_id": f"{prefix}{i}", "image_path": rel,
                     "view": "PA", "split": "test", "report": " ".join(sents), "text": " ".join(sents),
                     "sentences": sents})
    return write_manifest(pd.DataFrame(rows), base / "manifest.parquet", images)


@functools.cache
def build_assets(root: str) -> dict[str, Path]:
    """{'text': LM dir, 'checkpoint': ckpt dir, 'other_checkpoint': a second model, 'manifest': parquet,
    'images': image root, 'eta': eta table}."""
    import pandas as pd
    from PIL import Image

    from medclr.data.manifest import write_manifest
    from medclr.data.text import sentence_hash

    base = Path(root) / "app_assets"
    base.mkdir(parents=True, exist_ok=True)
    text = build_text_model(root)
    images = base / "images"
    images.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N_STUDIES):
        rel = f"p{i:02d}/s{i:02d}.png"
        (images / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_draw_cxr(rng)).save(images / rel)
        sents = [SENTENCES[i % len(SENTENCES)], SENTENCES[(i * 5 + 3) % len(SENTENCES)]]
        rows.append({"subject_id": f"1{i:03d}", "study_id": f"5{i:04d}", "dicom_id": f"d{i}", "image_path": rel,
                     "view": "PA", "split": "test" if i % 3 == 0 else "train", "report": " ".join(sents),
                     "text": " ".join(sents), "sentences": sents})
    # the real chest CR (MONOCHROME1 DICOM) as the last study, via a relative link in the image root
    dcm = images / "rg1" / "RG1_UNCI.dcm"
    dcm.parent.mkdir(exist_ok=True)
    if not dcm.exists():
        os.symlink(rg1_path(), dcm)
    rows[-1]["image_path"] = "rg1/RG1_UNCI.dcm"
    manifest = write_manifest(pd.DataFrame(rows), base / "manifest.parquet", images)
    eta = base / "eta.parquet"
    uniq = sorted({s for r in rows for s in r["sentences"]})
    from medclr.lm.eta import TABLE_COLUMNS, write_eta_table

    pll = [-3.0 - i for i in range(len(uniq))]
    write_eta_table(pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in uniq], "sentence": uniq,
                                  "count": 1, "n_tokens": 4, "n_scored": 4, "pll": pll,
                                  "pll_per_token": [p / 4 for p in pll],
                                  "eta": [0.05 + 0.01 * i for i in range(len(uniq))]})[TABLE_COLUMNS],
                    eta, {"norm": "sum", "eta_max": 0.5})
    ckpt = base / "checkpoint"
    if not (ckpt / "model.safetensors").is_file():
        make_checkpoint(ckpt, text, seed=0, eta_table=eta)
    other = base / "checkpoint_other"
    if not (other / "model.safetensors").is_file():
        make_checkpoint(other, text, seed=1)
    (base / "assets.json").write_text(json.dumps({"ok": True}))
    return {"text": text, "checkpoint": ckpt, "other_checkpoint": other, "manifest": manifest, "images": images,
            "eta": eta}


@pytest.fixture(scope="session")
def app_assets(tmp_path_factory) -> dict[str, Path]:
    return build_assets(str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def engine(app_assets):
    import torch

    from medclr.inference import load_checkpoint

    torch.set_num_threads(1)
    return load_checkpoint(app_assets["checkpoint"])


@functools.cache
def _built_index(root: str, checkpoint: str, manifest: str) -> Path:
    from medclr.index import build_index
    from medclr.inference import load_checkpoint

    out = Path(root) / "app_assets" / "index"
    if not (out / "index_manifest.json").is_file():
        build_index(load_checkpoint(checkpoint), manifest, out)
    return out


@pytest.fixture(scope="session")
def index_dir(app_assets, tmp_path_factory) -> Path:
    return _built_index(str(tmp_path_factory.getbasetemp()), str(app_assets["checkpoint"]),
                        str(app_assets["manifest"]))


@contextlib.contextmanager
def served_app(engine, index_dir, service_kw: dict | None = None, **launch_kw):
    """The real app (the tests' checkpoint and index) on a free local port: yields (url without the trailing
    slash, the AppService); the server stops when the block ends."""
    from medclr.app.service import AppService
    from medclr.index import load_index

    service = AppService(engine, load_index(index_dir, engine), **(service_kw or {}))
    with serve_in_background(service, **launch_kw) as url:
        yield url, service


def findings_record(classes) -> dict:
    """A validation record in ``medclr.findings``' shape: every class read with a steep Platt map and an operating
    point (-10) that every cosine margin clears, Pneumothorax flipped (not read)."""
    per = {c: {"n": 200, "n_pos": 40, "auc": 0.9, "auc_ci": [0.85, 0.95], "prevalence": 0.2, "direction": "positive",
               "platt": {"a": 40.0, "b": -1.0}, "threshold": -10.0, "reads": True, "reason": None} for c in classes}
    per["Pneumothorax"].update(auc=0.31, auc_ci=[0.22, 0.4], direction="flipped", reads=False,
                               reason="this model does not reliably read pneumothorax: validation AUC 0.31 "
                                      "(it ranks these images opposite to the finding)")
    return {"min_auc": 0.7, "split": "validate", "prompts": "paper", "n_boot": 100, "classes": per}


WIDE_STUDIES = 260  # more than the head re-ranks for the largest k (10 x 24 = 240 candidates)


@functools.cache
def build_wide_index(root: str) -> dict[str, Path]:
    """{'checkpoint', 'index'}: a 64-pixel checkpoint with ``findings_record`` and an index of WIDE_STUDIES drawn
    films, wide enough that a text search's candidates for k = 8 (100) are fewer than for k = 24 (240)."""
    import dataclasses

    from medclr.index import build_index
    from medclr.inference import load_checkpoint, read_metadata, write_metadata
    from medclr.prompts import CHEX5

    base = Path(root) / "wide_assets"
    out = {"checkpoint": base / "checkpoint", "index": base / "index"}
    if (out["index"] / "index_manifest.json").is_file():
        return out
    manifest = synthetic_test_manifest(base, WIDE_STUDIES, seed=1, prefix="w")
    make_checkpoint(out["checkpoint"], build_text_model(root), seed=2, image_size=64)
    write_metadata(out["checkpoint"], dataclasses.replace(read_metadata(out["checkpoint"]),
                                                          findings=findings_record(CHEX5)))
    build_index(load_checkpoint(out["checkpoint"]), manifest, out["index"])
    return out
