"""`medclr eval` end to end on a random checkpoint and a MIMIC-layout data set built here.

* the CLI writes metrics.json, phrases.csv, report.md and PNG figures, from a directory and from a
  manifest parquet (same numbers);
* a random (untrained) checkpoint scores at chance on every task, and so do the controls (shuffled
  labels, another phrase's map): the metric code cannot manufacture signal;
* planted signal through the same geometry code (RoIAlign box features, map upsampling) is found,
  so "at chance" above is not a runner that always outputs chance;
* bad input gives one clear line.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from medclr.data.labels import CHEX5, CHEXPERT_LABELS, MSCXR_CATEGORIES
from medclr.data.readers.mimic import METADATA_COLUMNS

WORDS = ("small large left right basal apical patchy opacity effusion heart enlarged edema pneumothorax "
         "consolidation atelectasis mild severe lung zone base apex lower upper").split()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --------------------------------------------------------------------------- builders


N_CATEGORIES = len(MSCXR_CATEGORIES)


def write_tree(root, n_test, n_train, seed=0, n_categories=N_CATEGORIES, train_phrases=False):
    """A MIMIC-CXR-JPG layout: noise JPEGs of two sizes (non-square ones exercise the crop geometry),
    reports, CheXpert labels drawn independently of the images, and an MS-CXR CSV with one phrase
    (1-2 boxes, unique text) per test image (and per train image with ``train_phrases``, as CXR-Phantom
    does). Returns (root, sentences for the tokenizer)."""
    rng = np.random.default_rng(seed)
    meta, split, labels, boxes, texts = [], [], [], [], []
    for i in range(n_test + n_train):
        subject, study, dicom = f"{10000000 + i}", f"{50000000 + i}", f"img{i:04d}"
        h, w = (80, 64) if i % 2 else (72, 72)
        folder = root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)).save(folder / f"{dicom}.jpg")
        report = f"{' '.join(rng.choice(WORDS, 4))} {i}."
        (folder.parent / f"s{study}.txt").write_text(f" FINDINGS: {report}\n IMPRESSION: No change.\n")
        texts.append(report)
        sp = "test" if i < n_test else "train"
        meta.append({c: "" for c in METADATA_COLUMNS} | {"dicom_id": dicom, "subject_id": subject, "study_id": study,
                                                         "ViewPosition": "PA", "Rows": h, "Columns": w})
        split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject, "split": sp})
        lab = {c: rng.choice([1.0, 0.0, 0.0, -1.0, np.nan]) for c in CHEX5}
        labels.append({"subject_id": subject, "study_id": study} | lab)
        if sp == "test" or train_phrases:
            text = f"{' '.join(rng.choice(WORDS, 3))} {i}"
            texts.append(text)
            cat = MSCXR_CATEGORIES[i % n_categories]
            for _ in range(1 + (i % 3 == 0)):
                bw, bh = int(rng.integers(8, 30)), int(rng.integers(8, 30))
                x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
                boxes.append({"dicom_id": dicom, "category_name": cat, "label_text": text, "path": f"{folder}/{dicom}.jpg",
                              "x": x, "y": y, "w": bw, "h": bh, "image_width": w, "image_height": h, "split": sp})
    pd.DataFrame(meta).to_csv(root / "mimic-cxr-2.0.0-metadata.csv.gz", index=False)
    pd.DataFrame(split).to_csv(root / "mimic-cxr-2.0.0-split.csv.gz", index=False)
    pd.DataFrame(labels, columns=["subject_id", "study_id", *CHEXPERT_LABELS]).to_csv(
        root / "mimic-cxr-2.0.0-chexpert.csv.gz", index=False)
    pd.DataFrame(boxes).to_csv(root / "MS_CXR_Local_Alignment_v1.1.0.csv", index=False)
    return root, texts


def make_checkpoint(path, sentences, head, seed=0):
    """A random DualEncoder (ResNet-18 at 64 px, tiny BERT + WordPiece trained here, joint dim 32)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from medclr.inference import CheckpointMeta, weights_sha256, write_metadata
    from medclr.models.dual import build_dual_encoder
    from medclr.prompts import CHEX5_PROMPTS

    prompts = [p for sides in CHEX5_PROMPTS.values() for v in sides.values() for p in v]
    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    tk.train_from_iterator(list(sentences) + prompts, trainers.WordPieceTrainer(
        vocab_size=400, min_frequency=1, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tk.token_to_id("[CLS]")), ("[SEP]", tk.token_to_id("[SEP]"))])
    tok = BertTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]")
    lm = path.parent / f"{path.name}_lm"
    tok.save_pretrained(lm)
    torch.manual_seed(seed)
    BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=64)).save_pretrained(lm)
    torch.manual_seed(seed)
    model = build_dual_encoder(lm, joint_dim=32, head=head, image_pretrained="none")
    model.head.trained = True  # stands for a trained checkpoint (an untrained lse_nl head is refused)
    model.save_pretrained(path)
    # shorter side -> 72, centre crop 64: a real crop, 2x2 region grid
    write_metadata(path, CheckpointMeta(image_size=64, resize=72, weights_sha256=weights_sha256(path)))
    return path


def medclr_main(*args):
    from medclr.cli import main

    return main([str(a) for a in args])


# --------------------------------------------------------------------------- end to end, small


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    root, texts = write_tree(d / "mimic", n_test=16, n_train=12, seed=1, n_categories=3)  # 3 heatmap figures
    ckpt = make_checkpoint(d / "ckpt", texts, head="cosine")
    return d, root, ckpt


def test_cli_writes_metrics_report_and_figures(small, capsys):
    d, root, ckpt = small
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--out", d / "report", "--n-boot", 50) == 0
    assert "metrics.json" in capsys.readouterr().out
    m = json.loads((d / "report" / "metrics.json").read_text())
    assert m["tasks"] == ["zeroshot", "grounding", "sides", "retrieval", "reports", "probe"]
    assert set(m["summary"]) == {"AUC", "ACC", "CNR", "mIoU", "Recall", "MedR"}
    rep = m["reports"]  # study-level image <-> report retrieval, no labels needed
    assert rep["n_studies"] == 16 and 0 <= rep["i2t/R@1"] <= rep["i2t/R@5"] <= rep["i2t/R@10"] <= 1
    assert rep["chance"]["R@1"] == pytest.approx(1 / 16) and 1 <= rep["t2i/MedR"] <= 16
    assert m["zeroshot"]["n_images"] == 16 and m["grounding"]["n_phrases"] == 16 and m["retrieval"]["n_phrases"] == 16
    assert m["probe"]["n_train"] == 12 and "chex5" in m["probe"]
    assert m["model"]["preprocess"] == {"image_size": 64, "resize": 72, "source": "checkpoint_meta.json"}
    report = (d / "report" / "report.md").read_text()
    for needle in ("Table 1", "Table 3", "Table 4", "Table 5", "DCL-η_LM (paper)", "not MIMIC numbers", "Linear probe",
                   "Study-level retrieval"):
        assert needle in report
    pngs = sorted((d / "report" / "figures").glob("*.png"))
    names = {p.name for p in pngs}
    assert {"roc.png", "retrieval_examples.png"} <= names and any(n.startswith("grounding_") for n in names)
    for p in pngs:
        assert p.stat().st_size < 1_000_000 and f"figures/{p.name}" in report
    per = pd.read_csv(d / "report" / "phrases.csv")
    assert len(per) == 16 and {"CNR", "mIoU", "CNR_control", "i2t_rank", "t2i_rank", "map_range"} <= set(per.columns)
    from medclr.inference.heatmap import MIN_MAP_RANGE

    flat = m["grounding"]["flat_maps"]  # the app's no-heatmap rule, counted over the phrases
    assert flat["n"] == 16 and flat["n_flat"] == int((per["map_range"] < MIN_MAP_RANGE).sum())
    assert f"{flat['n_flat']} of 16 phrase maps" in report
    assert per["i2t_rank"].between(1, 16).all()

    # the same data as a manifest parquet (+ .mscxr.parquet beside it): the same numbers
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from medclr.data.readers.mscxr import read_mscxr

    write_manifest(read_mimic_cxr_jpg(root, views=None), d / "m.parquet", root)
    read_mscxr(root / "MS_CXR_Local_Alignment_v1.1.0.csv").to_parquet(d / "m.mscxr.parquet", index=False)
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", d / "m.parquet", "--out", d / "r2", "--n-boot", 50,
                       "--tasks", "zeroshot,grounding,retrieval", "--no-figures",
                       "--compare", f"first run={d / 'report' / 'metrics.json'}") == 0
    m2 = json.loads((d / "r2" / "metrics.json").read_text())
    assert "| first run |" in (d / "r2" / "report.md").read_text() and not (d / "r2" / "figures").exists()
    for k in ("AUC", "ACC", "CNR", "mIoU", "Recall", "MedR"):
        assert m2["summary"][k] == pytest.approx(m["summary"][k], rel=1e-6), k


def test_study_retrieval_scores_equal_a_float64_brute_force(small):
    """For a cosine head the task's study scores are global image embedding . report embedding, the report the
    normalised mean of its sentences' unit embeddings: the same matrix in float64, and its ranks."""
    from medclr.evaluation.data import load_eval_data, split_rows
    from medclr.evaluation.runner import Model, encode
    from medclr.evaluation.task_reports import report_embeddings, study_scores
    from medclr.metrics import bidirectional_retrieval

    _d, root, ckpt = small
    data = load_eval_data(root)
    model = Model(ckpt)
    rows = split_rows(data, "test")
    enc = encode(model, data, rows, set(rows.tolist()), None, 8, 0)
    pos = enc.take(rows)
    reports = [list(s) for s in data.manifest.loc[enc.rows[pos], "sentences"]]
    got = study_scores(model, enc, pos, report_embeddings(model, reports), chunk=5)
    want = []
    for sents in reports:
        e = model.texts(sents).double().numpy()
        m = e.mean(axis=0)
        want.append(m / np.linalg.norm(m))
    brute = enc.glob[pos].astype(np.float64) @ np.stack(want).T
    np.testing.assert_allclose(got, brute, atol=1e-5)
    assert bidirectional_retrieval(got, ks=(1, 5, 10)) == bidirectional_retrieval(brute, ks=(1, 5, 10))


def test_zero_shot_uses_the_head_score_equal_to_the_protocols_cosine(small):
    """For a cosine head the runner's score is evaluation.zeroshot.cosine_zero_shot_scores on global embeddings."""
    from medclr.evaluation.data import load_eval_data, split_rows
    from medclr.evaluation.runner import Model, encode
    from medclr.evaluation.zeroshot import PAPER_PROMPTS, cosine_zero_shot_scores
    from medclr.prompts import CHEX5_PROMPTS

    assert PAPER_PROMPTS is CHEX5_PROMPTS  # one prompt table for the project
    _d, root, ckpt = small
    data = load_eval_data(root)
    model = Model(ckpt)
    enc = encode(model, data, split_rows(data, "test"), set(), PAPER_PROMPTS, 8, 0)
    emb = {c: (model.texts(s["positive"]).numpy(), model.texts(s["negative"]).numpy()) for c, s in PAPER_PROMPTS.items()}
    pos, neg = cosine_zero_shot_scores(enc.glob, emb, CHEX5)
    np.testing.assert_allclose(enc.s_pos, pos, atol=1e-5)
    np.testing.assert_allclose(enc.s_neg, neg, atol=1e-5)


# --------------------------------------------------------------------------- random checkpoint at chance


def test_random_checkpoint_scores_at_chance(tmp_path):
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from medclr.data.readers.mscxr import read_mscxr
    from medclr.evaluation.runner import evaluate

    root, texts = write_tree(tmp_path / "mimic", n_test=200, n_train=100, seed=2)
    ckpt = make_checkpoint(tmp_path / "ckpt", texts, head="lse_nl", seed=3)
    df = read_mimic_cxr_jpg(root, views=None)
    df["latent_class"] = np.random.default_rng(4).integers(0, 4, len(df))  # phantom-style ground truth
    write_manifest(df, tmp_path / "m.parquet", root)
    read_mscxr(root / "MS_CXR_Local_Alignment_v1.1.0.csv").to_parquet(tmp_path / "m.mscxr.parquet", index=False)
    m = evaluate(str(ckpt), str(tmp_path / "m.parquet"), str(tmp_path / "out"), n_boot=200, figures=False)
    assert (tmp_path / "out" / "metrics.json").is_file()

    z = m["zeroshot"]
    assert abs(z["macro"]["AUC"] - 0.5) < 0.15
    assert abs(z["control_shuffled_labels"]["AUC"] - 0.5) < 0.15
    assert z["macro"]["AUC_CI"][0] < 0.5 < z["macro"]["AUC_CI"][1] or abs(z["macro"]["AUC"] - 0.5) < 0.1

    g = m["grounding"]
    assert g["n_phrases"] == 200
    assert abs(g["CNR"]["micro"] - g["CNR_control"]["micro"]) < 0.15  # the map does not depend on the right phrase
    assert abs(g["mIoU"]["micro"] - g["mIoU_control"]["micro"]) < 0.05

    r = m["retrieval"]
    n = r["n_phrases"]
    assert n == 200 and r["n_duplicate_texts"] == 0
    for d in ("i2t", "t2i"):
        assert abs(r[f"{d}/R@10"] - 10 / n) < 0.06
        assert abs(r[f"{d}/R@100"] - 100 / n) < 0.15
        assert abs(r[f"{d}/MedR"] - (n + 1) / 2) < n / 6
    assert abs(r["Recall"] - r["chance"]["Recall"]) < 0.08

    p = m["probe"]
    assert abs(p["chex5"]["100%"]["macro_AUC"] - 0.5) < 0.15
    assert abs(p["control_shuffled_labels"]["macro_AUC"] - 0.5) < 0.15
    assert abs(p["latent_class"]["100%"]["macro_AUC"] - 0.5) < 0.15


# --------------------------------------------------------------------------- planted signal is found


def test_planted_signal_through_the_runner_geometry():
    """Region features that encode position, and 'texts' that name the cells of a box: the runner's
    RoIAlign and map geometry must retrieve and ground them (so chance above is the model's)."""
    from medclr.evaluation.grounding import CropGeometry
    from medclr.evaluation.retrieval import bidirectional_retrieval
    from medclr.evaluation.task_grounding import ground_one
    from medclr.evaluation.task_retrieval import box_feature, retrieval_scores

    geo = CropGeometry.from_resize_crop((200, 160), 72, 64)  # portrait: rows are cropped
    gh = gw = 8
    regions = torch.eye(gh * gw).reshape(gh * gw, gh, gw)  # cell (i, j) = one-hot
    rng = np.random.default_rng(0)
    boxes, feats, texts, grids = [], [], [], []
    sy, sx = geo.resize_h / geo.original_h, geo.resize_w / geo.original_w
    for _ in range(40):
        w, h = rng.integers(30, 60, 2)
        x, y = rng.integers(0, 160 - w), rng.integers(40, 160 - h)  # inside the crop window
        b = np.array([[x, y, w, h]], dtype=np.float64)
        boxes.append(b)
        feats.append(box_feature(regions, b, geo)[0])
        # independent geometry: cell centres (grid coords) carried back to original pixels
        ci = ((np.arange(gh) + 0.5) * geo.crop_h / gh + geo.crop_top) / sy
        cj = ((np.arange(gw) + 0.5) * geo.crop_w / gw + geo.crop_left) / sx
        inside = ((ci >= y) & (ci < y + h))[:, None] & ((cj >= x) & (cj < x + w))[None, :]
        texts.append(torch.from_numpy(inside.astype(np.float32).ravel() + 1e-3))
        grids.append(np.where(inside, 0.8, -0.8))
    own = np.array([ground_one(grids[k], geo, boxes[k]) for k in range(40)])
    other = np.array([ground_one(grids[k - 1], geo, boxes[k]) for k in range(40)])  # another phrase's map
    assert own[:, 0].mean() > 1.5 and own[:, 0].mean() > 3 * other[:, 0].mean()
    assert own[:, 1].mean() > other[:, 1].mean() + 0.05
    r = bidirectional_retrieval(retrieval_scores(torch.stack(feats), torch.stack(texts)))
    assert r["i2t/R@10"] > 0.9 and r["t2i/R@10"] > 0.9 and r["MedR"] <= 3
    # a box wholly outside the crop is flagged, not dropped
    assert box_feature(regions, np.array([[10, 0, 20, 10]]), geo)[1] == 1


def test_text_level_retrieval_merges_identical_texts():
    from medclr.evaluation.retrieval import bidirectional_retrieval, text_level_retrieval

    texts = ["a", "a", "b", "c", "c", "c"]
    onehot = np.eye(3)[pd.factorize(pd.Series(texts))[0]]
    s = onehot @ onehot.T  # a perfect model: every box scores its own text 1, the others 0
    paper = bidirectional_retrieval(s)  # identical texts tie, and ties count against the query
    assert paper["i2t/MedR"] > 1
    t = text_level_retrieval(s, texts, ks=(1, 2))
    assert t["n_texts"] == 3 and t["i2t/R@1"] == 1.0 and t["t2i/R@1"] == 1.0 and t["MedR"] == 1.0
    assert t["chance"]["i2t/R@1"] == pytest.approx(1 / 3)
    assert t["chance"]["t2i/R@1"] == pytest.approx(np.mean([2 / 6, 1 / 6, 3 / 6]))  # g/n for one draw
    rng = np.random.default_rng(0)
    r = text_level_retrieval(rng.normal(size=(6, 6))[:, pd.factorize(pd.Series(texts))[0]], texts, ks=(1, 2, 6))
    assert r["i2t/R@6"] == 1.0 and r["t2i/R@6"] == 1.0


# --------------------------------------------------------------------------- bad input


def test_bad_data_path_is_one_clear_line(small, tmp_path):
    _d, _root, ckpt = small
    res = subprocess.run([sys.executable, "-m", "medclr", "eval", "--checkpoint", str(ckpt), "--data",
                          str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert "nowhere" in lines[0] and "no such file or directory" in lines[0]


def test_unavailable_task_and_bad_args(small, tmp_path, capsys):
    d, root, ckpt = small
    (tmp_path / "bare").mkdir()
    for f in ("files", "mimic-cxr-2.0.0-metadata.csv.gz", "mimic-cxr-2.0.0-split.csv.gz", "mimic-cxr-2.0.0-chexpert.csv.gz"):
        (tmp_path / "bare" / f).symlink_to(root / f)
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", tmp_path / "bare", "--tasks", "grounding",
                       "--out", tmp_path / "o") == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("medclr eval")]  # not tqdm's
    assert len(err) == 1 and "--tasks grounding: not available" in err[0] and "no MS-CXR phrases" in err[0]
    # without boxes report.md says what that means (not "`None`") and there is no phrases.csv, not even the one an
    # earlier run with boxes left in the same --out
    out = tmp_path / "o"
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--tasks", "grounding", "--n-boot", 0,
                       "--no-figures", "--out", out) == 0
    assert len(pd.read_csv(out / "phrases.csv")) == 16
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", tmp_path / "bare", "--tasks", "zeroshot", "--n-boot", 0,
                       "--no-figures", "--out", out) == 0
    report = (out / "report.md").read_text()
    assert "- MS-CXR boxes: none with this data, so grounding and phrase retrieval are not measured" in report
    assert "None" not in report and sorted(p.name for p in out.iterdir()) == ["metrics.json", "report.md"]
    assert medclr_main("eval", "--checkpoint", tmp_path / "nockpt", "--data", root) == 1
    assert "--checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--tasks", "zeroshot,segmentation")


def test_unreadable_image_is_recorded_and_left_out_and_phrase_selection(small, tmp_path):
    _d, _root, ckpt = small
    root, _ = write_tree(tmp_path / "mimic", n_test=8, n_train=4, seed=5, n_categories=2, train_phrases=True)
    bad = sorted((root / "files").rglob("*.jpg"))[3]
    bad.write_bytes(b"\xff\xd8 truncated")
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--out", tmp_path / "o", "--n-boot", 0,
                       "--tasks", "zeroshot,grounding,retrieval", "--no-figures") == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert len(m["failed_images"]) == 1 and bad.name in m["failed_images"][0]["path"]
    assert m["zeroshot"]["n_images"] == 7 and m["retrieval"]["n_phrases"] == 7
    # default (auto): only phrases on the evaluated test images, none on training images
    assert m["grounding"]["n_phrases"] == 8  # the unreadable image's phrase stays listed, its metric NaN (counted)
    assert sum(m["grounding"]["CNR"]["n_nan"].values()) == 1
    per = pd.read_csv(tmp_path / "o" / "phrases.csv")
    assert set(per["manifest_split"]) == {"test"}
    # --mscxr-split all: every phrase (the paper's MS-CXR protocol); the report warns about train images
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--out", tmp_path / "a", "--n-boot", 0,
                       "--tasks", "grounding", "--mscxr-split", "all", "--no-figures") == 0
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert m["grounding"]["n_phrases"] == 12 and any("train split" in n for n in m["notes"])
    assert "train split" in (tmp_path / "a" / "report.md").read_text()


def test_a_non_finite_embedding_is_a_failed_image_not_a_metric(small, monkeypatch):
    """An image the model turns into NaN is left out with its reason (failed_images); the metrics stay finite."""
    import torch

    from medclr.evaluation.data import Model, encode, load_eval_data, split_rows
    from medclr.inference.engine import NON_FINITE
    from medclr.models.image import ImageFeatures

    _d, root, ckpt = small
    data = load_eval_data(root)
    model = Model(ckpt)
    real = model.features
    calls = []

    def first_image_nan(batch):
        f = real(batch)
        calls.append(1)
        glob = f.global_emb.clone()
        if len(calls) == 1:
            glob[0] = torch.nan
        return ImageFeatures(f.regions, glob)

    monkeypatch.setattr(model, "features", first_image_nan)
    rows = split_rows(data, "test")
    enc = encode(model, data, rows, set(), None, 4, 0)
    assert len(enc.failed) == 1 and enc.failed[0]["error"] == NON_FINITE and enc.failed[0]["index"] == int(rows.min())
    assert enc.rows.size == rows.size - 1 and np.isfinite(enc.glob).all()


# --------------------------------------------------------------------------- the task registry


def test_tasks_are_the_task_modules_in_report_order():
    from medclr.evaluation.report import SUMMARY_KEYS
    from medclr.evaluation.runner import TASKS
    from medclr.evaluation.tasks import task_names

    assert task_names() == TASKS == ("zeroshot", "grounding", "sides", "retrieval", "reports", "probe")
    assert SUMMARY_KEYS == ("AUC", "ACC", "CNR", "mIoU", "Recall", "MedR")  # the paper's Table 1 row


def test_sides_measures_the_apps_side_check(small, tmp_path):
    """Each phrase that names one side gets the app's decision: the engine's scores of the phrase and of its other-side
    twin on the image (``medclr.app.grounding``'s route), decided by ``medclr.inference.preference``."""
    import math

    from medclr.app.grounding import _scores
    from medclr.data.hard_negatives import swap_side
    from medclr.inference import load_checkpoint
    from medclr.inference.preference import PREFERENCE_ODDS, preference

    tau = 0.07
    gap = tau * math.log(PREFERENCE_ODDS)  # the two-sentence softmax gives 2:1 exactly at this score gap
    assert math.exp(gap / tau) == pytest.approx(2.0)
    assert (preference(gap, 0.0, tau), preference(0.999 * gap, 0.0, tau), preference(0.0, gap, tau)) == (1, 0, -1)

    d, root, ckpt = small
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--out", tmp_path / "o", "--tasks", "sides",
                       "--no-figures") == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())["sides"]
    per = pd.read_csv(tmp_path / "o" / "phrases.csv")
    engine = load_checkpoint(ckpt)
    sided = 0
    for _, row in per.iterrows():
        twin = swap_side(row["text"], [row["text"], "No change."])  # the fixture's report: the phrase, then "No change."
        if twin is None:
            assert math.isnan(row["side"]) and math.isnan(row["side_gap"])
            continue
        sided += 1
        (image,) = root.glob(f"files/*/*/*/{row['dicom_id']}.jpg")
        mine, theirs = _scores(engine, engine.encode(image), [row["text"], twin])
        assert row["side_alternative"] == twin
        assert row["side_gap"] == pytest.approx(mine - theirs, abs=1e-5)
        assert row["side"] == preference(mine, theirs, engine.tau)
    assert sided >= 3 and m["n"] == sided and m["n_right"] + m["n_wrong"] + m["n_undecided"] == sided
    assert m["right"] == pytest.approx(m["n_right"] / sided) and m["n_phrases_total"] == len(per)
    assert "## Sides: the app's side check" in (tmp_path / "o" / "report.md").read_text()


def test_a_new_task_is_one_module(small, tmp_path, monkeypatch):
    """A task defined in one place reaches metrics.json, phrases.csv, Table 1, report.md and the pooled
    report without any other change (the registry is extended here as a task_*.py file would extend it)."""
    from medclr.evaluation import tasks as registry
    from medclr.evaluation.seeds_run import evaluate_seeds
    from medclr.evaluation.tasks import Column, Task

    class PhraseLength(Task):  # the number of words of each phrase: a toy, but a real task
        name, order, uses, columns = "phrase_length", 25, frozenset({"phrases"}), (Column("Words", "↓", 1),)

        def unavailable(self, inp):
            return None if len(inp.phrases) else "no MS-CXR phrases"

        def run(self, inp):
            words = inp.phrases.table["text"].str.split().str.len()
            return {"mean_words": float(words.mean())}, pd.DataFrame({"words": words.to_numpy()})

        def summary(self, block):
            return {"Words": block["mean_words"]}

        def section(self, metrics, block, figs):
            return ["## Phrase length", "", f"{block['mean_words']:.2f} words per phrase", ""]

        def pool(self, runs, summary):
            from medclr.evaluation.seeds import pooled_entry

            return {"mean_words": pooled_entry(runs, ("phrase_length", "mean_words"))}

        def pooled_section(self, pooled, names):
            return ["## Phrase length (pooled)", "", f"n = {pooled['mean_words']['n']}", ""]

    builtin = registry.tasks()
    monkeypatch.setattr(registry, "_registry", lambda: tuple(sorted((*builtin, PhraseLength()), key=lambda t: t.order)))
    d, root, ckpt = small
    assert medclr_main("eval", "--checkpoint", ckpt, "--data", root, "--out", tmp_path / "o", "--n-boot", 0,
                       "--tasks", "zeroshot,phrase_length", "--no-figures") == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    per = pd.read_csv(tmp_path / "o" / "phrases.csv")
    words = [len(t.split()) for t in per["text"]]
    assert m["tasks"] == ["zeroshot", "phrase_length"] and m["phrase_length"]["mean_words"] == pytest.approx(np.mean(words))
    assert per["words"].tolist() == words
    assert list(m["summary"]) == ["AUC", "ACC", "CNR", "mIoU", "Words", "Recall", "MedR"]  # its place: order 25
    assert m["summary"]["Words"] == m["phrase_length"]["mean_words"] and m["summary"]["CNR"] is None
    report = (tmp_path / "o" / "report.md").read_text()
    assert "| mIoU ↑ | Words ↓ | Recall ↑ |" in report and "| DCL-η_LM (paper) | 0.86 | 0.72 | 1.49 | 0.20 | – |" in report
    assert report.index("## Zero-shot") < report.index("## Phrase length") and "words per phrase" in report
    pooled = evaluate_seeds([str(ckpt), str(ckpt)], str(root), str(tmp_path / "R"), tasks=["phrase_length"], n_boot=0,
                            figures=False)
    assert pooled["summary"]["Words"] == pytest.approx(np.mean(words))
    assert pooled["pooled"]["phrase_length"]["mean_words"]["n"] == 2
    assert "## Phrase length (pooled)\n\nn = 2" in (tmp_path / "R" / "report.md").read_text()
