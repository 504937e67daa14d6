"""The training package: configs, sampler, data, 2-process torchrun, exact resume after SIGKILL, bad input.

Data: a tiny MIMIC-CXR-JPG tree written here (read by the real reader) with synthetic 32 px
images, a bright disc for "effusion" studies, and reports that say so; a tiny BERT with its own
WordPiece tokenizer saved to tmp_path. Training runs go through the real `medclr train` CLI in
subprocesses (torchrun for the distributed one), with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from medclr.data.labels import CHEXPERT_LABELS
from medclr.errors import MedclrError

REPO = Path(__file__).resolve().parents[1]
FINDING = ["There is a small right pleural effusion.", "The heart size is normal."]
NORMAL = ["No pleural effusion is seen.", "The lungs are clear."]
TINY = ["preset=cpu_small", "data.resize=36", "data.crop=32", "data.cache_workers=1", "data.num_workers=0",
        "model.max_length=16", "train.max_minutes=null", "log.every=1", "log.progress=false", "val.every=null",
        "optim.warmup_steps=3", "optim.lr=3e-4", "optim.lr_text=3e-4", "seed=0"]


def write_tiny_mimic(root: Path, n: int = 16, n_val: int = 4, size: int = 40) -> Path:
    """A MIMIC-CXR-JPG tree: n train + n_val validate studies, one PA image each; even studies have an effusion."""
    from medclr.data.readers.mimic import METADATA_COLUMNS

    rng = np.random.default_rng(0)
    meta, split, labels = [], [], []
    yy, xx = np.mgrid[:size, :size]
    for k in range(n + n_val):
        subject, study, dicom = f"1{k:07d}", f"5{k:07d}", f"{k:08x}-0000-0000-0000-000000000000"
        folder = root / "files" / f"p{subject[:2]}" / f"p{subject}" / f"s{study}"
        folder.mkdir(parents=True, exist_ok=True)
        finding = k % 2 == 0
        img = 60 + 20 * rng.random((size, size))
        if finding:  # a bright disc low on the image's left (the patient's right)
            img[(yy - 0.7 * size) ** 2 + (xx - 0.3 * size) ** 2 < (0.2 * size) ** 2] = 230
        Image.fromarray(img.astype(np.uint8)).save(folder / f"{dicom}.jpg", quality=95)
        sents = FINDING if finding else NORMAL
        (folder.parent / f"s{study}.txt").write_text(" FINDINGS: " + " ".join(sents) + "\n IMPRESSION: " + sents[0] + "\n")
        meta.append({c: "" for c in METADATA_COLUMNS} | {"dicom_id": dicom, "subject_id": subject, "study_id": study,
                                                         "ViewPosition": "PA", "Rows": size, "Columns": size})
        split.append({"dicom_id": dicom, "study_id": study, "subject_id": subject,
                      "split": "train" if k < n else "validate"})
        labels.append({"subject_id": subject, "study_id": study, "Pleural Effusion": 1.0 if finding else 0.0})
    pd.DataFrame(meta).to_csv(root / "mimic-cxr-2.0.0-metadata.csv.gz", index=False)
    pd.DataFrame(split).to_csv(root / "mimic-cxr-2.0.0-split.csv.gz", index=False)
    pd.DataFrame(labels, columns=["subject_id", "study_id", *CHEXPERT_LABELS]).to_csv(
        root / "mimic-cxr-2.0.0-chexpert.csv.gz", index=False)
    return root


def write_tiny_bert(out: Path, sentences: list[str]) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.train_from_iterator(sentences, trainers.WordPieceTrainer(
        vocab_size=200, min_frequency=1, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False))
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok = BertTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", model_max_length=32)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=32, pad_token_id=tok.pad_token_id)
    BertForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(manifest path, text model dir) shared by the module's tests."""
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg

    base = tmp_path_factory.mktemp("tiny")
    root = write_tiny_mimic(base / "mimic")
    manifest = write_manifest(read_mimic_cxr_jpg(root), base / "manifest.parquet", root)
    lm = write_tiny_bert(base / "lm", FINDING + NORMAL)
    return manifest, lm


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _train_cmd(config: str, manifest: Path, lm: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "medclr", "train", "--config", config, *TINY,
            f"data.manifest={manifest}", f"model.text={lm}", f"out={out}", *extra]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


# --------------------------------------------------------------------------- fast, in-process


def test_sampler_global_batches_are_distinct_and_equal_per_rank():
    from medclr.training.sampler import GlobalBatchSampler

    n, gb, world = 23, 8, 2
    per_rank = [iter(GlobalBatchSampler(n, gb, r, world, seed=3)) for r in range(world)]
    for step in range(3 * (n // gb)):
        parts = [next(it) for it in per_rank]
        assert all(len(p) == gb // world for p in parts)
        idx = [i for p in parts for _, i in p]
        assert len(set(idx)) == gb, "an index appears twice in one global batch"
        assert {e for p in parts for e, _ in p} == {step // (n // gb)}
    # resuming at step 4 continues the same sequence
    a = GlobalBatchSampler(n, gb, 1, world, seed=3)
    b = GlobalBatchSampler(n, gb, 1, world, seed=3, start_step=4)
    seq = [x for _, x in zip(range(6), iter(a))]
    assert next(iter(b)) == seq[4]
    with pytest.raises(MedclrError, match="not divisible"):
        GlobalBatchSampler(n, 9, 0, 2)
    with pytest.raises(MedclrError, match="fewer than"):
        GlobalBatchSampler(5, 8)


def test_auto_precision_is_bf16_on_cpus_with_bf16_hardware():
    """train.precision=auto: bf16 autocast on a CPU whose flags (read here from /proc/cpuinfo, not from
    torch) say AVX512-BF16 or AMX, float32 on any other CPU; explicit values are kept."""
    from medclr.training.loop import _amp

    cpu = torch.device("cpu")
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").is_file() else None
    if flags is not None:
        hardware = "avx512_bf16" in flags or "amx_tile" in flags
        assert _amp({"train": {"precision": "auto"}}, cpu) == (torch.bfloat16 if hardware else None)
    assert _amp({"train": {"precision": "fp32"}}, cpu) is None
    assert _amp({"train": {"precision": "bf16"}}, cpu) == torch.bfloat16


def test_config_layers_presets_and_overrides():
    from medclr.training.config import load_config

    cfg = load_config("dcl", ["loss.eta=0.05", "data.manifest=m.parquet", "out=o", "optim.lr=1e-4", "train.batch_size=16"])
    assert cfg["loss"] == {"name": "dcl", "eta_source": "none", "zeta_key": "sentence", "tau": 0.07, "eta": 0.05,
                           "anchor": "text"}
    assert cfg["model"]["arch"] == "resnet18" and cfg["data"]["crop"] == 64  # cpu_small preset
    assert cfg["model"]["stages"] == 3 and cfg["model"]["output_stride"] == 8 and cfg["model"]["head"] == "lse_nl"
    assert cfg["data"]["sentence_sampling"] == "findings" and cfg["train"]["max_steps"] == 450
    assert cfg["optim"]["lr"] == 1e-4 and cfg["train"]["batch_size"] == 16
    paper = load_config("nuclr", ["data.manifest=m", "out=o", "preset=paper"])
    assert paper["optim"]["lr"] == 1e-5 and paper["optim"]["warmup_steps"] == 2000
    assert paper["train"]["batch_size"] == 64 and paper["model"]["joint_dim"] == 128
    assert paper["loss"]["tau"] == 0.01 and paper["loss"]["gamma"] == 0.8 and paper["loss"]["freeze_zeta_epochs"] == 5
    # gpu_small extends cpu_small: the whole ResNet-18 at 128 px, the hard-negative term and 2,500 steps on top
    gpu = load_config("dcl", ["loss.eta=0.05", "data.manifest=m", "out=o", "preset=gpu_small", "train.max_steps=300"])
    assert gpu["preset"] == "gpu_small" and gpu["model"]["arch"] == "resnet18" and gpu["data"]["crop"] == 128
    assert gpu["model"]["output_stride"] == 16 and gpu["model"]["stages"] == 4
    assert gpu["optim"]["lr"] == 1e-3 and gpu["model"]["lse_gamma"] == 20
    assert gpu["data"]["sentence_sampling"] == "findings" and gpu["hard_negatives"]["weight"] == 1.0
    assert gpu["train"]["max_steps"] == 300 and load_config("dcl", ["data.manifest=m", "out=o", "preset=gpu_small"]
                                                             )["train"]["max_steps"] == 2500
    # cpu_zeroshot extends cpu_small: the hard-negative term, rare-finding draws, short forms and 1,000 steps on top
    zs = load_config("infonce", ["data.manifest=m", "out=o", "preset=cpu_zeroshot"])
    assert zs["data"]["crop"] == 64 and zs["model"]["output_stride"] == 8 and zs["hard_negatives"]["weight"] == 1.0
    assert zs["data"]["study_sampling"] == "findings" and zs["data"]["study_balance"] == 1.0
    assert zs["data"]["short_form"] == 0.3 and cfg["data"]["short_form"] == 0.0
    assert zs["train"]["max_steps"] == 1000 == 10 * zs["ckpt"]["every"] and zs["ckpt"]["keep_last"] == 2


@pytest.mark.parametrize("config, overrides, message", [
    ("infonce", ["loss.name=nope"], "loss.name 'nope': unknown loss"),
    ("dcl_lm", [], "data.eta: loss dcl_lm with eta_source=lm needs an eta table"),
    ("dcl_lm", ["data.eta=/nonexistent/eta.parquet"], "eta table not found"),
    ("infonce", ["optim.lrr=1"], "'optim.lrr' is unknown (did you mean 'optim.lr'?)"),
    ("infonce", ["loss.temperature=1"], "not an argument of loss infonce"),
    ("infonce", ["train.batch_size=abc"], "expected a number"),
    ("sogclr", ["loss.freeze_zeta_epochs=1"], "config loss.freeze_zeta_epochs: not an argument of loss sogclr"),
    ("infonce", ["loss.zeta_lr_schedule=cosine"], "config loss.zeta_lr_schedule: not an argument of loss infonce"),
    ("nope", [], "no such file"),
    ("infonce", ["data.augment_on=gpu"], "config data.augment_on 'gpu': expected auto, loader or device"),
    ("infonce", ["data.short_form=2"], "config data.short_form 2.0: expected a probability in [0, 1]"),
    ("nuclr", ["loss.zeta_key=report"], "config loss.zeta_key 'report': expected one of sentence, study"),
    ("dcl_lm", ["loss.eta_source=oracle", "data.eta=x"], "expected one of none, lm, true, rho_sent, study_prior"),
    # issue 46: every typed key of base.yaml is checked when the config is read (training/schema.py's tables)
    ("infonce", ["optim.lr=-1"], "config optim.lr -1.0: expected a number >= 0"),
    ("infonce", ["train.epochs=-1", "train.max_steps=null"], "config train.epochs -1.0: expected a number > 0 or null"),
    ("infonce", ["train.max_steps=0"], "config train.max_steps 0: a run of no steps writes the model untrained"),
    ("infonce", ["train.max_steps=-3"], "config train.max_steps -3: expected a whole number >= 0 or null"),
    ("infonce", ["model.text=[1, 2]"], "config model.text [1, 2]: expected a path or a hub id"),
    ("infonce", ["model.init=[a]"], "config model.init ['a']: expected a path"),
    ("infonce", ["model.arch={a: 1}"], "config model.arch {'a': 1}: expected a name"),
    ("infonce", ["seed=-1"], "config seed -1: expected a whole number in [0, 4294967295]"),
    ("infonce", ["optim.lr_text=fast"], "config optim.lr_text 'fast': expected a number >= 0 or null"),
    ("infonce", ["optim.betas=[0.9, 1.0]"], "config optim.betas [0.9, 1.0]: expected a list of 2 numbers, each "
                                            "number in [0, 1)"),
    ("infonce", ["optim.eps=0"], "config optim.eps 0.0: expected a number > 0"),
    ("infonce", ["optim.weight_decay=-0.1"], "config optim.weight_decay -0.1: expected a number >= 0"),
    ("infonce", ["optim.grad_clip=-1"], "config optim.grad_clip -1.0: expected a number >= 0"),
    ("infonce", ["train.max_minutes=0"], "config train.max_minutes 0: expected a number > 0 or null"),
    ("infonce", ["model.joint_dim=0"], "config model.joint_dim 0: expected a whole number >= 1"),
    ("infonce", ["model.max_length=0"], "config model.max_length 0: expected a whole number >= 1"),
    ("infonce", ["model.text_buckets=0"], "config model.text_buckets 0: expected auto or a whole number >= 1"),
    ("infonce", ["data.num_workers=-1"], "config data.num_workers -1: expected auto or a whole number >= 0"),
    ("infonce", ["data.cache_workers=-1"], "config data.cache_workers -1: expected a whole number >= 0"),
    ("infonce", ["data.aug.prob=1.5"], "config data.aug.prob 1.5: expected a probability in [0, 1]"),
    ("infonce", ["data.aug.contrast=1"], "config data.aug.contrast 1.0: expected a number in [0, 1)"),
    ("infonce", ["data.aug.gamma=[1.25, 0.8]"], "config data.aug.gamma [1.25, 0.8]: expected a list of 2 numbers, "
                                                "each number > 0, the first <= the second"),
    ("infonce", ["hard_negatives.tau=0"], "config hard_negatives.tau 0.0: expected a number > 0"),
    ("infonce", ["val.every=-1"], "config val.every -1: expected a whole number >= 0 or null"),
    ("infonce", ["ckpt.keep_last=0"], "config ckpt.keep_last 0: expected a whole number >= 1"),
    ("infonce", ["model.pooling=max"], "config model.pooling 'max': expected mean or cls"),
    ("infonce", ["model.projector=deep"], "config model.projector 'deep': expected linear or mlp"),
    ("infonce", ["model.channels_last=1"], "config model.channels_last 1: expected auto, true or false"),
    ("infonce", ["log.progress=sometimes"], "config log.progress 'sometimes': expected auto, true or false"),
    ("infonce", ["train.precision=fp8"], "config train.precision 'fp8': expected auto, bf16, fp16 or fp32"),
])
def test_bad_config_is_one_clear_line(config, overrides, message):
    from medclr.training.config import load_config

    with pytest.raises(MedclrError, match=re.escape(message)):
        load_config(config, ["data.manifest=m.parquet", "out=o", *overrides])


def test_dataset_is_a_function_of_seed_epoch_index(tiny, tmp_path):
    from medclr.data.text import sentence_hash
    from medclr.lm.eta import TABLE_COLUMNS, write_eta_table
    from medclr.training.config import load_config
    from medclr.training.data import PairDataset, load_table

    manifest, _ = tiny
    sents = FINDING + NORMAL + [FINDING[0]]  # repeated sentences: the table has one row per distinct sentence
    eta = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in sents[:4]], "sentence": sents[:4], "count": 1,
                        "n_tokens": 5, "n_scored": 5, "pll": -1.0, "pll_per_token": -0.2, "eta": [0.1, 0.2, 0.3, 0.4]})
    write_eta_table(eta[TABLE_COLUMNS], tmp_path / "eta.parquet", {})
    cfg = load_config("dcl_lm", [*TINY, f"data.manifest={manifest}", f"data.eta={tmp_path / 'eta.parquet'}", "out=o"])
    table = load_table(cfg)
    assert len(table) == 16
    ds = PairDataset(table, cfg)
    a, b = ds[(2, 5)], ds[(2, 5)]
    assert torch.equal(a["image"], b["image"]) and a["sentence"] == b["sentence"] and a["image"].shape == (1, 32, 32)
    want = dict(zip(sents[:4], [0.1, 0.2, 0.3, 0.4]))
    for e in range(6):  # eta follows the sentence drawn
        item = ds[(e, 3)]
        assert item["eta"] == pytest.approx(want[item["sentence"]])
    assert not torch.equal(ds[(0, 5)]["image"], ds[(1, 5)]["image"])  # a new crop each epoch
    assert torch.equal(ds[5]["image"], ds[5]["image"])                  # the eval view is fixed

    # data.short_form=1: every drawn sentence with a short form is replaced by it; eta and NUCLR's text index are
    # those of the text shown (the eta table holds the short forms: `medclr lm score` scores them)
    shown = {"Pleural effusion.": 0.15, "No pleural effusion.": 0.35}
    forms = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in shown], "sentence": list(shown), "count": 0,
                          "n_tokens": 3, "n_scored": 3, "pll": -1.0, "pll_per_token": -0.3, "eta": list(shown.values())})
    write_eta_table(pd.concat([eta, forms])[TABLE_COLUMNS], tmp_path / "eta_short.parquet", {})
    short_cfg = [*TINY, f"data.manifest={manifest}", "out=o", "data.short_form=1", "hard_negatives.weight=1"]
    cfg = load_config("dcl_lm", [*short_cfg, f"data.eta={tmp_path / 'eta_short.parquet'}"])
    table = load_table(cfg)
    assert set(shown) <= set(table.texts) and table.texts == sorted(table.texts)
    ds = PairDataset(table, cfg)
    drawn = [ds[(e, i)] for e in range(4) for i in range(len(table))]
    assert {it["sentence"] for it in drawn} <= set(shown) | set(NORMAL + FINDING) and set(shown) <= \
        {it["sentence"] for it in drawn}
    for it in drawn:
        assert it["eta"] == pytest.approx({**want, **shown}[it["sentence"]])
        assert table.texts[it["text_index"]] == it["sentence"]
        if it["sentence"] == "Pleural effusion.":  # its hard negatives are made from the short form
            assert "No pleural effusion." in it["hard"]
    assert ds[5]["sentence"] in sents  # the eval view keeps the report's own sentence
    # the sentence draw alone (no image read) replays what each training view paired
    assert [ds.training_sentence(e, i)[1] for e in range(4) for i in range(len(table))] == [it["sentence"] for it in drawn]
    with pytest.raises(MedclrError, match="short form 'No pleural effusion.'"):  # a table scored before short forms
        load_table(load_config("dcl_lm", [*short_cfg, f"data.eta={tmp_path / 'eta.parquet'}"]))

    # dcl_true: eta = DCL's false-negative rate q of the text shown, counted here by brute force: the share of the
    # training studies (uniform draws) its statement is true of; eta_source=rho_sent and study_prior are the others
    from medclr.data.manifest import read_manifest, write_manifest
    from medclr.phantom.sentence_keys import key_holds, rho_sent, sentence_key

    df = read_manifest(manifest)
    df["latent_class"] = np.where(df["index"] % 2 == 0, "pleural_effusion:right", "normal")
    df["latent_class_prob"] = np.where(df["index"] % 2 == 0, 0.25, 0.5)
    truth = write_manifest(df, tmp_path / "truth.parquet", df.attrs["root"])
    cfg = load_config("dcl_true", [*short_cfg, f"data.manifest={truth}", "data.eta_max=0.9"])
    table = load_table(cfg)
    train = df[df["split"] == "train"]
    studies = [(c, frozenset(sentence_key(x) for x in r)) for c, r in zip(train["latent_class"], train["sentences"])]
    ds = PairDataset(table, cfg)
    seen = set()
    for e in range(2):
        for i in range(len(table)):
            item = ds[(e, i)]
            key = sentence_key(item["sentence"])
            q = sum(key_holds(key, c, own) for c, own in studies) / len(studies)
            assert item["eta"] == pytest.approx(min(q, 0.9)) and table.texts[item["text_index"]] == item["sentence"]
            seen.add(item["sentence"])
    assert {"Pleural effusion.", "No pleural effusion."} <= seen  # short forms: q of the short form itself
    assert ds.table.text_eta["No pleural effusion."] == pytest.approx(0.5)  # true of the 8 normal studies of 16
    cfg = load_config("dcl_true", [*TINY, f"data.manifest={truth}", "out=o", "loss.eta_source=rho_sent"])
    table = load_table(cfg)
    rho = rho_sent(table.sentences, sentence_sampling=cfg["data"]["sentence_sampling"],
                   other_weight=cfg["data"]["other_sentence_weight"])
    ds = PairDataset(table, cfg)
    for i in range(4):
        item = ds[(0, i)]
        assert item["eta"] == pytest.approx(rho[i][table.sentences[i].index(item["sentence"])])
    cfg = load_config("dcl_true", [*TINY, f"data.manifest={truth}", "out=o", "loss.eta_source=study_prior"])
    ds = PairDataset(load_table(cfg), cfg)
    assert [ds[(0, i)]["eta"] for i in range(4)] == [0.25, 0.5, 0.25, 0.5]


# --------------------------------------------------------------------------- subprocess runs


def test_torchrun_two_processes_nuclr_learns_and_saves_tables(tiny, tmp_path):
    """Two processes, NUCLR through the LSE+NL head (inside DDP): it learns, the head is trained and saved."""
    manifest, lm = tiny
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "medclr",
           *_train_cmd("nuclr", manifest, lm, out, "train.batch_size=16", "train.max_steps=20", "ckpt.every=10",
                       "ckpt.keep_last=1", "loss.freeze_zeta_epochs=0", "loss.tau=0.1", "model.head=lse_nl",
                       "model.output_stride=16", "hard_negatives.weight=1")[3:]]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [m["loss"] for m in _metrics(out) if "loss" in m]
    assert len(losses) == 20
    assert all(m["hard_negative_term"] > 0 for m in _metrics(out) if "loss" in m)  # reduced over both ranks
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1, losses
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 20 and state["n_train"] == 16
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000020"]  # keep_last=1 pruned step 10
    assert {f"rng_rank{r}.pt" for r in (0, 1)} <= {p.name for p in (out / "checkpoints" / "step-0000020").iterdir()}
    tables = _tensors(out / "checkpoints" / "step-0000020" / "loss_state.safetensors")
    from medclr.data.text import sentence_hash
    from medclr.inference.checkpoint import hash_to_int

    train = pd.read_parquet(manifest).query("split == 'train'")
    texts = sorted({s for row in train["sentences"] for s in row})  # nuclr.yaml: zeta_key sentence
    for name in ("u_img", "u_txt", "zeta_img"):
        assert tables[name].shape == (16,)
    assert tables["zeta_txt"].shape == (len(texts),)  # the tiny reports share 4 distinct sentences
    assert tables["text_sentence_hash"].tolist() == [hash_to_int(sentence_hash(t)) for t in texts]
    assert torch.isfinite(tables["u_img"]).all()  # every sample visited (the global batch is the whole set)
    moved = tables["zeta_txt"] != torch.tensor(-0.05)  # zeta learned after the (zero) freeze, for the sentences drawn
    assert bool(moved.all())  # 20 steps of every report: each sentence drawn after the freeze
    assert int(tables["step"]) == 20
    train_rows = pd.read_parquet(manifest).query("split == 'train'")["index"]
    assert sorted(tables["sample_manifest_index"].tolist()) == sorted(train_rows.tolist())  # position -> manifest row
    from medclr.models import DualEncoder

    model = DualEncoder.from_pretrained(out)  # OUT itself is the checkpoint
    assert model.joint_dim == 128 and model.head.kind == "lse_nl" and model.head.trained
    assert float(model.head.nl.out.weight.detach().abs().max()) > 0  # the non-local block left its zero init: trained
    assert json.loads((out / "config.json").read_text())["image"]["output_stride"] == 16
    from medclr.inference import read_metadata

    meta = read_metadata(out)  # what every reader of OUT takes, written at the save beside the model
    assert (meta.image_size, meta.resize, meta.tau, meta.loss, meta.eta_source) == (32, 36, 0.1, "nuclr", "none")
    assert (meta.step, meta.total_steps, meta.n_train, meta.global_batch) == (20, 20, 16, 16)
    assert meta.manifest == str(Path(manifest).resolve()) and meta.data_fingerprint == state["fingerprint"]
    assert meta.source["image_size"] == "checkpoint_meta.json" and not (out / "preprocess.json").exists()
    from medclr.inference import weights_sha256

    assert meta.weights_sha256 == weights_sha256(out)  # the published weights are the ones the save hashed
    assert json.loads((out / "data_quality.json").read_text())["rows"] == 16  # the training rows' summary


def _cli(argv: list[str]) -> int:
    """`medclr ...` in this process, single-threaded like the subprocesses (bitwise-comparable floats)."""
    from medclr.cli import main

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng():
            return main(argv)
    finally:
        torch.set_num_threads(threads)


# the LSE+NL run also applies the intensity augmentation in the step (data.augment_on=device), whose
# per-item parameters must resume exactly without any device RNG state, and runs the towers under bf16
# autocast on the CPU, validation included (its head scores bf16 trunk features in float32)
@pytest.mark.parametrize("head, augment_on, precision", [("cosine", "loader", "fp32"), ("lse_nl", "device", "bf16")])
def test_resume_after_sigkill_matches_straight_run(tiny, tmp_path, capsys, head, augment_on, precision):
    manifest, lm = tiny
    n_steps = 3
    # with the rule hard negatives on and finding sentences drawn first: their draws must resume exactly too
    args = ("train.batch_size=8", f"train.max_steps={2 * n_steps}", f"ckpt.every={n_steps}", "ckpt.keep_last=5",
            "loss.freeze_zeta_epochs=1", f"model.head={head}", "model.output_stride=16", "hard_negatives.weight=1",
            "data.sentence_sampling=findings", f"data.augment_on={augment_on}", f"train.precision={precision}",
            "val.every=0")  # zeta frozen for 2 steps, then
    # nuclr.yaml's cosine step size
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # The straight 2N-step run and the resumed run go through the CLI in this process (saves two
    # interpreter start-ups); the run that is killed must be a real process.
    assert _cli(_train_cmd("nuclr", manifest, lm, straight, *args)[3:]) == 0

    victim = subprocess.Popen(_train_cmd("nuclr", manifest, lm, killed, *args), env=_env(), cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = killed / "checkpoints" / f"step-{n_steps:07d}"
    deadline = time.monotonic() + 120
    while not target.is_dir() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)  # right after the step-N checkpoint is renamed into place
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert target.is_dir() and not (killed / "checkpoints" / f"step-{2 * n_steps:07d}").exists()

    assert _cli(_train_cmd("nuclr", manifest, lm, killed, *args)[3:] + ["--resume"]) == 0
    for name in ("model.safetensors", "loss_state.safetensors"):
        a, b = _tensors(straight / name), _tensors(killed / name)
        assert a.keys() == b.keys()
        for k in a:  # "resumable to the bit": same single-threaded CPU kernels, same data, same RNG streams
            assert torch.equal(a[k], b[k]), (name, k, float((a[k].double() - b[k].double()).abs().max()))
    tables = _tensors(killed / "loss_state.safetensors")
    assert {"u_img", "u_txt", "zeta_img", "zeta_txt"} <= tables.keys() and int(tables["step"]) == 2 * n_steps
    assert (tables["zeta_txt"] != -0.05).any() and "text_sentence_hash" in tables  # per sentence, moved
    la = [m["loss"] for m in _metrics(straight) if "loss" in m]
    lb = [m["loss"] for m in _metrics(killed) if "loss" in m]
    assert len(lb) == 2 * n_steps and la == lb  # metrics.jsonl: the killed run's extra lines were dropped
    assert "val/chex5_auc" in _metrics(killed)[-1]  # the validation at the end ran
    hard = [m["hard_negative_term"] for m in _metrics(killed) if "loss" in m]
    assert len(hard) == 2 * n_steps and all(0 < h < m["loss"] for h, m in zip(hard, _metrics(killed)))

    # a data set of another size is refused with one line, before any work
    from medclr.data.manifest import read_manifest, write_manifest

    df = read_manifest(manifest)
    smaller = write_manifest(df.iloc[2:], tmp_path / "smaller.parquet", df.attrs["root"])
    capsys.readouterr()
    assert _cli(_train_cmd("nuclr", smaller, lm, killed, *args)[3:] + ["--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dataset size mismatch" in err[0] and "16 pairs" in err[0] and "now has 14" in err[0]


def test_model_init_starts_from_a_checkpoints_weights(tiny, tmp_path, capsys):
    """model.init: a run starts from another run's weights (every tensor; the optimizer afresh); a run with a zero
    learning rate therefore ends on exactly those weights (batch-norm statistics, which training updates
    without the optimizer, aside). Changed weights are refused in one line."""
    manifest, lm = tiny
    args = ("train.batch_size=8", "ckpt.every=100", "val.every=null", "model.head=lse_nl", "model.output_stride=16")
    first, second = tmp_path / "first", tmp_path / "second"
    assert _cli(_train_cmd("infonce", manifest, lm, first, *args, "train.max_steps=3")[3:]) == 0
    assert _cli(_train_cmd("dcl", manifest, lm, second, *args, "train.max_steps=2", f"model.init={first}",
                           "optim.lr=0", "optim.lr_text=0", "optim.warmup_steps=0")[3:]) == 0
    a, b = _tensors(first / "model.safetensors"), _tensors(second / "model.safetensors")
    a = {k: v for k, v in a.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert len(a) > 50 and all(torch.equal(a[k], b[k]) for k in a)
    fresh = tmp_path / "fresh"
    assert _cli(_train_cmd("dcl", manifest, lm, fresh, *args, "train.max_steps=1", "optim.lr=0", "optim.lr_text=0",
                           "optim.warmup_steps=0")[3:]) == 0
    assert not all(torch.equal(v, _tensors(fresh / "model.safetensors")[k]) for k, v in a.items())
    from safetensors.torch import load_file, save_file

    weights = load_file(first / "model.safetensors")
    name = next(k for k in weights if k.startswith("image_encoder."))
    weights[name] = -weights[name]
    save_file(weights, first / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert _cli(_train_cmd("dcl", manifest, lm, tmp_path / "third", *args, "train.max_steps=1",
                           f"model.init={first}")[3:]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert any("model.init" in line and "SHA-256" in line for line in err), err[-3:]


def test_model_init_keeps_this_runs_fixed_lse_gamma(tiny, tmp_path, caplog):
    """A fixed LSE gamma is a setting: a fine-tune from a checkpoint trained at gamma 5 with model.lse_gamma=11 pools
    at 11 (the init file's buffer does not overwrite it) and says so; a learned gamma is a weight and comes from the
    init."""
    import math

    manifest, lm = tiny
    args = ("train.batch_size=8", "ckpt.every=100", "val.every=null", "model.head=lse_nl", "optim.lr=0",
            "optim.lr_text=0", "optim.warmup_steps=0", "train.max_steps=1")
    first, fixed, learned = tmp_path / "first", tmp_path / "fixed", tmp_path / "learned"
    assert _cli(_train_cmd("infonce", manifest, lm, first, *args, "model.lse_gamma=5")[3:]) == 0
    caplog.clear()
    with caplog.at_level("INFO"):
        assert _cli(_train_cmd("infonce", manifest, lm, fixed, *args, "model.lse_gamma=11", f"model.init={first}")[3:]) == 0
    assert "LSE gamma 11 from model.lse_gamma (the init checkpoint trained with 5)" in caplog.text
    assert _tensors(fixed / "model.safetensors")["head.log_gamma"].item() == pytest.approx(math.log(11), abs=1e-6)
    assert json.loads((fixed / "config.json").read_text())["head"]["gamma"] == pytest.approx(11, rel=1e-6)
    assert _cli(_train_cmd("infonce", manifest, lm, learned, *args, "model.lse_gamma=11", "model.lse_learn_gamma=true",
                           f"model.init={first}")[3:]) == 0
    assert _tensors(learned / "model.safetensors")["head.log_gamma"].item() == pytest.approx(math.log(5), abs=1e-6)


def test_resume_with_more_steps_extends_a_finished_run(tiny, tmp_path, capsys):
    """--resume with a larger train.max_steps trains exactly the extra steps, on the learning rates a run planned
    for the new length has at those steps; a smaller one is refused in one line."""
    manifest, lm = tiny
    args = ("train.batch_size=8", "ckpt.every=100", "val.every=null")
    short, straight = tmp_path / "short", tmp_path / "straight"
    assert _cli(_train_cmd("infonce", manifest, lm, short, *args, "train.max_steps=4")[3:]) == 0
    assert _cli(_train_cmd("infonce", manifest, lm, straight, *args, "train.max_steps=7")[3:]) == 0
    capsys.readouterr()
    assert _cli(_train_cmd("infonce", manifest, lm, short, *args, "train.max_steps=7")[3:] + ["--resume"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["train"]
    assert summary["start_step"] == 4 and summary["steps"] == 7 and summary["total_steps"] == 7
    resumed = {m["step"]: m["lr"] for m in _metrics(short) if "lr" in m}
    planned = {m["step"]: m["lr"] for m in _metrics(straight) if "lr" in m}
    assert sorted(resumed) == list(range(1, 8))
    assert all(resumed[s] == pytest.approx(planned[s], rel=1e-12) for s in (5, 6, 7))
    assert resumed[4] == 0.0 < resumed[5]  # the 4-step run ended at lr 0; the 7-step cosine resumes above it
    assert _cli(_train_cmd("infonce", manifest, lm, short, *args, "train.max_steps=5")[3:] + ["--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.max_steps 5 is below the run's 7 steps (7 done)" in err[0]


def test_missing_text_model_and_existing_run_are_refused(tiny, tmp_path):
    import shutil

    from medclr.training.config import load_config
    from medclr.training.loop import preflight

    manifest, lm = tiny
    common = [*TINY, "train.batch_size=8", f"out={tmp_path / 'o'}"]
    # model.text unset: the default is lm/ next to the manifest (the demo's layout) ...
    cfg = load_config("infonce", [*common, f"data.manifest={manifest}"])
    assert preflight(cfg, None, 1).text_model == str(lm)
    # ... and without one there, one line says what to do
    alone = shutil.copy(manifest, tmp_path / "manifest.parquet")
    cfg = load_config("infonce", [*common, f"data.manifest={alone}"])
    with pytest.raises(MedclrError, match="run `medclr lm fit` or pass model.text=DIR"):
        preflight(cfg, None, 1)
    cfg = load_config("dcl_true", [*common, f"data.manifest={manifest}", "loss.eta_source=study_prior"])
    with pytest.raises(MedclrError, match="latent_class_prob"):
        preflight(cfg, None, 1)
    cfg = load_config("infonce", [*common, f"data.manifest={manifest}", "train.batch_size=32"])
    with pytest.raises(MedclrError, match="16 usable pairs, fewer than train.batch_size 32"):
        preflight(cfg, None, 1)
    cfg = load_config("infonce", [*common, f"data.manifest={manifest}"])
    with pytest.raises(MedclrError, match="no checkpoint"):
        preflight(cfg, "auto", 1)


def test_loss_options_reach_the_loss_through_its_hooks(tiny, tmp_path):
    """nuclr's freeze_zeta_epochs / zeta_lr_schedule keep their meaning; the loss converts and checks them
    itself (its configure hook, in preflight: before any model is built)."""
    from medclr.training.config import load_config
    from medclr.training.loop import preflight

    manifest, lm = tiny
    common = [*TINY, "train.batch_size=8", f"data.manifest={manifest}", f"model.text={lm}", f"out={tmp_path / 'o'}"]
    plan = preflight(load_config("nuclr", [*common, "train.max_steps=40"]), None, 1)
    assert plan.steps_per_epoch == 2 and plan.loss.freeze_zeta_steps == 10  # nuclr.yaml: 5 epochs
    assert plan.loss.zeta_lr_schedule == "cosine" and plan.loss_warnings == []
    plan = preflight(load_config("nuclr", [*common, "train.max_steps=6"]), None, 1)
    assert len(plan.loss_warnings) == 1 and "covers the whole run (6 steps)" in plan.loss_warnings[0]
    with pytest.raises(MedclrError, match="zeta_lr_schedule 'linear': expected one of constant, cosine"):
        preflight(load_config("nuclr", [*common, "loss.zeta_lr_schedule=linear"]), None, 1)
    with pytest.raises(MedclrError, match="set freeze_zeta_epochs or freeze_zeta_steps, not both"):
        preflight(load_config("nuclr", [*common, "loss.freeze_zeta_steps=3"]), None, 1)


@pytest.mark.slow
def test_phantom_dcl_true_and_dcl_lm_train(tmp_path):
    """On real CXR-Phantom output: prepare -> ground truth -> dcl_true, and an eta table -> dcl_lm."""
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from medclr.data.text import sentence_hash
    from medclr.lm.eta import TABLE_COLUMNS, write_eta_table
    from medclr.phantom import attach_ground_truth

    ph = tmp_path / "phantom"
    proc = subprocess.run([sys.executable, "-m", "medclr", "phantom", "--out", str(ph), "--n", "48", "--size", "64",
                           "--seed", "1", "--eval-per-class", "4", "--val-per-class", "6", "--quiet"], env=_env(),
                          capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = attach_ground_truth(read_mimic_cxr_jpg(ph, views=None), ph)
    manifest = write_manifest(df, tmp_path / "manifest.parquet", ph)
    sents = sorted({s for ss in df["sentences"] for s in ss})
    lm = write_tiny_bert(tmp_path / "lm", sents)
    eta = pd.DataFrame({"sentence_hash": [sentence_hash(s) for s in sents], "sentence": sents, "count": 1,
                        "n_tokens": 5, "n_scored": 5, "pll": -5.0, "pll_per_token": -1.0,
                        "eta": np.linspace(0.01, 0.3, len(sents))})
    write_eta_table(eta[TABLE_COLUMNS], tmp_path / "eta.parquet", {})
    for config in ("dcl_true", "dcl_lm"):
        out = tmp_path / config
        # dcl_lm validates with the report-style prompts: its findings record and stored prompts follow them
        prompt_set = "report" if config == "dcl_lm" else "paper"
        cmd = _train_cmd(config, manifest, lm, out, "train.batch_size=8", "train.max_steps=4", "val.every=0",
                         f"data.eta={tmp_path / 'eta.parquet'}", f"val.prompts={prompt_set}")
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])["train"]
        assert summary["steps"] == 4 and np.isfinite(summary["last_loss"])
        assert (out / "model.safetensors").is_file() and (out / "checkpoint_meta.json").is_file()
    # the CheX5 prompts are stored for these weights: a scorer loads no text tower (medclr.inference.stored_prompts)
    from medclr.inference import load_checkpoint

    lean = load_checkpoint(tmp_path / "dcl_lm", text=False)
    assert lean.model.text_encoder is None and len(lean.prompt_embeddings()) == 5
    assert lean.prompts_name == "report" and load_checkpoint(tmp_path / "dcl_true", text=False).prompts_name == "paper"
    # the end-of-training validation recorded, per CheX5 finding, whether the model reads it (medclr.findings):
    # every labelled validation image (6 balanced studies per class and the pool's share), not val.max_images
    from medclr.inference import read_metadata
    from medclr.prompts import CHEX5

    rec = read_metadata(tmp_path / "dcl_lm").findings
    n_val = int((df["split"] == "validate").sum())
    assert rec["split"] == "validate" and set(rec["classes"]) == set(CHEX5) and rec["prompts"] == "report"
    for entry in rec["classes"].values():
        assert entry["n"] <= n_val and entry["n_pos"] >= 6 and isinstance(entry["reads"], bool)
        assert entry["reads"] == (entry["reason"] is None) and entry["platt"] is not None
