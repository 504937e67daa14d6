"""`medclr import biovil` (issue 46, item 10): BioViL / BioViL-T + CXR-BERT as published, without a corpus.

The inputs are stand-ins in the published layouts (``tests.test_published``): hi-ml-multimodal's ``ImageModel`` with
random weights saved as hi-ml saves it, and hi-ml's ``CXRBertModel`` saved with the tokenizer_config.json of the hub
snapshot, whose ``auto_map`` names ``microsoft/BiomedVLP-CXR-BERT-specialized--tokenization_cxrbert.CXRBertTokenizer``.
The import must give the model a ``medclr train ... train.max_steps=0`` run gives from the same files (the same
tensors, so the same embeddings), a checkpoint that score, eval and export load, and a log line about the local
folder that does not send the user to the hub.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from tests.test_published import _biovil_file, write_cxr_bert

SENTENCES = ["No pleural effusion.", "Small left pneumothorax", "heart size is normal", "lungs are clear."]


@pytest.fixture(scope="module")
def cxr_bert_hub_layout(tmp_path_factory):
    """A CXR-BERT folder as a hub snapshot of microsoft/BiomedVLP-CXR-BERT-specialized holds it: its auto_map
    names the repository, which is what made transformers print a hub address for a local folder."""
    folder = tmp_path_factory.mktemp("cxrbert")
    write_cxr_bert(folder, "microsoft/BiomedVLP-CXR-BERT-specialized--tokenization_cxrbert.CXRBertTokenizer", 512)
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from tests.test_training import write_tiny_mimic

    tmp = tmp_path_factory.mktemp("corpus")
    root = write_tiny_mimic(tmp / "mimic")
    return root, write_manifest(read_mimic_cxr_jpg(root), tmp / "manifest.parquet", root)


def _run(args, capsys):
    from medclr.cli import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("encoder_type", ["resnet50", "resnet50_multi_image"])
def test_import_equals_a_run_of_no_steps(encoder_type, cxr_bert_hub_layout, corpus, tmp_path, capsys, caplog):
    """The import's checkpoint holds the tensors, config and embeddings of today's path (train.max_steps=0) on the
    same files, with the same crop, resize, tau and sentence length; only the training-side record differs."""
    from safetensors.torch import load_file

    from medclr.inference import load_checkpoint, read_metadata, weights_sha256
    from tests.test_training import TINY

    _, manifest = corpus
    _, weights = _biovil_file(tmp_path, encoder_type, joint=32)
    text = cxr_bert_hub_layout
    run = tmp_path / "run"
    code, _, err = _run(["train", "--config", "infonce", *TINY, f"data.manifest={manifest}", f"model.text={text}",
                         f"out={run}", "model.arch=resnet50", "model.projector=mlp", "model.joint_dim=32",
                         "model.image_pretrained=biovil", f"model.image_weights={weights}", "model.pooling=cls",
                         "model.head=cosine", "model.stages=4", "model.output_stride=32", "train.batch_size=8",
                         "train.max_steps=0"], capsys)
    assert code == 0, err
    caplog.clear()
    with caplog.at_level(logging.INFO):
        code, out, err = _run(["import", "biovil", "--image-weights", str(weights), "--text", str(text), "--out",
                               str(tmp_path / "imported"), "--resize", "36", "--crop", "32", "--max-length", "16"],
                              capsys)
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    kind = "biovil_t" if encoder_type == "resnet50_multi_image" else "biovil"
    assert (summary["kind"], summary["crop"], summary["resize"], summary["tau"]) == (kind, 32, 36, 0.07)
    # the tokenizer line names the local file and sends nobody to the hub
    said = [r.getMessage() for r in caplog.records if "CXRBertTokenizer" in r.getMessage()]
    assert said and all("hf.co" not in s and "inspect the repository" not in s for s in said), said
    assert str(text / "tokenizer_config.json") in said[0]

    imported = tmp_path / "imported"
    ours, theirs = load_file(imported / "model.safetensors"), load_file(run / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert json.loads((imported / "config.json").read_text()) == json.loads((run / "config.json").read_text())
    meta, run_meta = read_metadata(imported), read_metadata(run)
    assert (meta.image_size, meta.resize, meta.tau) == (run_meta.image_size, run_meta.resize, run_meta.tau)
    assert meta.weights_sha256 == weights_sha256(imported) and meta.findings is None and meta.loss is None
    record = json.loads((imported / "import.json").read_text())
    assert record["kind"] == kind and record["image_weights"] == str(weights.resolve())

    a, b = load_checkpoint(imported), load_checkpoint(run)
    images = torch.rand(3, 1, 32, 32, generator=torch.Generator().manual_seed(2))
    fa, fb = a.image_features(images), b.image_features(images)
    torch.testing.assert_close(fa.regions, fb.regions, atol=0, rtol=0)
    torch.testing.assert_close(fa.global_emb, fb.global_emb, atol=0, rtol=0)
    np.testing.assert_array_equal(a.embed_texts(SENTENCES), b.embed_texts(SENTENCES))
    for cls, (pos, neg) in a.prompt_embeddings().items():  # the stored prompts: what score uses without a text tower
        theirs = b.prompt_embeddings()[cls]
        torch.testing.assert_close(pos, theirs[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(neg, theirs[1], atol=1e-6, rtol=0)


def test_score_eval_and_export_load_an_import(cxr_bert_hub_layout, corpus, tmp_path, capsys):
    import pandas as pd

    root, manifest = corpus
    _, weights = _biovil_file(tmp_path, "resnet50", joint=32)
    ckpt = tmp_path / "biovil"
    code, _, err = _run(["import", "biovil", "--image-weights", str(weights), "--text", str(cxr_bert_hub_layout),
                         "--out", str(ckpt), "--resize", "36", "--crop", "32"], capsys)
    assert code == 0, err
    code, _, err = _run(["score", "--checkpoint", str(ckpt), "--input", str(root), "--out", str(tmp_path / "s.parquet"),
                         "--no-progress", "--device", "cpu"], capsys)
    assert code == 0, err
    scored = pd.read_parquet(tmp_path / "s.parquet")
    assert len(scored) == 20 and scored["Pleural Effusion"].between(0, 1).all()
    assert scored["Pleural Effusion reason"].str.contains("not validated").all()  # no validation record: said
    code, _, err = _run(["eval", "--checkpoint", str(ckpt), "--data", str(manifest), "--out", str(tmp_path / "eval"),
                         "--split", "validate", "--tasks", "zeroshot", "--n-boot", "20", "--no-figures",
                         "--device", "cpu", "--no-progress"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["checkpoint"] == str(ckpt)
    code, _, err = _run(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(tmp_path / "hf")], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["image"]["init"] == "biovil"


def test_import_refuses_in_one_line(cxr_bert_hub_layout, tmp_path, capsys):
    """A folder that is not an earlier import, a text model that is not CXR-BERT, a projection of another size,
    a file that is not BioViL's: one line each, nothing written; an earlier import is replaced."""
    from tests.conftest_app import build_text_model

    _, weights = _biovil_file(tmp_path, "resnet50", joint=32)
    (tmp_path / "wide").mkdir()
    _, wide = _biovil_file(tmp_path / "wide", "resnet50", joint=128)
    text = str(cxr_bert_hub_layout)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")

    def refused(*args, needle):
        code, _, err = _run(["import", "biovil", *map(str, args)], capsys)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and needle in lines[0], lines

    refused("--image-weights", weights, "--text", text, "--out", mine, needle="not an earlier `medclr import`")
    assert (mine / "notes.txt").read_text() == "keep me"
    refused("--image-weights", weights, "--text", build_text_model(str(tmp_path)), "--out", tmp_path / "o",
            needle="not a CXR-BERT folder")
    refused("--image-weights", wide, "--text", text, "--out", tmp_path / "o", needle="gives 32 values, the image "
            "file's projector 128")
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "resnet.pth")
    refused("--image-weights", tmp_path / "resnet.pth", "--text", text, "--out", tmp_path / "o",
            needle="not a hi-ml-multimodal ImageModel")
    refused("--image-weights", weights, "--text", text, "--out", tmp_path / "o", "--crop", "600", needle="--crop 600")
    assert not (tmp_path / "o").exists()
    out = tmp_path / "again"
    for _ in range(2):  # the second replaces the first
        code, _, err = _run(["import", "biovil", "--image-weights", str(weights), "--text", text, "--out", str(out),
                             "--resize", "36", "--crop", "32"], capsys)
        assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".again", "again"))) == ["again"]
