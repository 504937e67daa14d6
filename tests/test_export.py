"""`medclr export` (issue 32): the ONNX and TorchScript graphs equal PyTorch, the Hugging Face folder reloads with
plain transformers + safetensors + torchvision to the same embeddings, and its model card names the metrics it
came from and says a phantom-trained model is not for clinical use.

The checkpoint is the small real one of the app tests (``tests.conftest_app``: a one-layer BERT, ResNet-18 at 64 px,
the LSE+NL head), with a non-local block that is not the identity and the metadata a phantom run records."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from medclr.prompts import CHEX5_REPORT_PROMPTS, reduce_prompts
from tests.conftest_app import SENTENCES, build_text_model, make_checkpoint

REPO = Path(__file__).resolve().parents[1]
SIZE, RESIZE = 64, 72


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    import pandas as pd

    from medclr.data.labels import CHEX5
    from medclr.data.manifest import write_manifest
    from medclr.findings import fit_findings
    from medclr.inference import CheckpointMeta, weights_sha256, write_metadata
    from medclr.models.dual import DualEncoder

    root = tmp_path_factory.mktemp("export")
    ckpt = make_checkpoint(root / "checkpoint", build_text_model(str(root)), image_size=SIZE)
    model = DualEncoder.from_pretrained(ckpt)
    torch.manual_seed(1)
    torch.nn.init.normal_(model.head.nl.out.weight, std=0.2)  # a trained block: not the identity it starts as
    model.save_pretrained(ckpt)
    # a phantom's manifest carries the ground truth's latent classes
    manifest = write_manifest(pd.DataFrame({"report": SENTENCES, "split": "train", "latent_class": "normal"}),
                              root / "manifest.parquet", root)
    rng = np.random.default_rng(0)
    labels = (rng.random((40, len(CHEX5))) < 0.3).astype(float)
    margins = labels * np.array([2.0, 0.0, 1.5, 0.1, 1.0]) + rng.normal(size=labels.shape)
    findings = fit_findings(margins, labels, CHEX5, n_boot=50, split="validate")
    write_metadata(ckpt, CheckpointMeta(image_size=SIZE, resize=RESIZE, tau=0.05, loss="dcl_lm", eta_source="lm",
                                        manifest=str(manifest), split="train", n_train=len(SENTENCES), global_batch=4,
                                        step=30, total_steps=30, last_loss=1.25, findings=findings,
                                        weights_sha256=weights_sha256(ckpt)))
    return ckpt


@pytest.fixture(scope="module")
def engine(checkpoint):
    from medclr.inference import load_checkpoint

    return load_checkpoint(checkpoint)


def _images(n: int) -> torch.Tensor:
    return torch.rand(n, 1, SIZE, SIZE, generator=torch.Generator().manual_seed(7))


def _tokens(folder: Path, sentences: list[str], max_length: int) -> dict[str, np.ndarray]:
    """The exported tokenizer, with the sentence cleanup export.json states, as another tool would use them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    texts = [s.strip().rstrip(".?!").rstrip() for s in sentences]
    batch = tok(texts, padding="longest", truncation=True, max_length=max_length, return_tensors="np")
    return {"input_ids": batch["input_ids"].astype(np.int64), "attention_mask": batch["attention_mask"].astype(np.int64)}


def _lse_float64(cosines: np.ndarray, gamma: float) -> np.ndarray:
    """(1/gamma) log mean_r exp(gamma c_r) over the last axis, in float64."""
    c = cosines.astype(np.float64)
    return np.log(np.mean(np.exp(gamma * c), axis=-1)) / gamma


def _check_graphs(out: Path, engine, run) -> None:
    """``run(graph name, inputs) -> outputs`` on a batch unlike the ones traced (2) and checked (3, 10): the
    exported image, text and score graphs equal PyTorch to 1e-4, and the score is the LSE formula."""
    record = json.loads((out / "export.json").read_text())
    assert record["image"]["centre_crop"] == SIZE and record["image"]["resize_shorter_side"] == RESIZE
    assert record["tau"] == pytest.approx(0.05) and set(record["prompts"]["sets"]) == set(engine.prompt_embeddings())
    assert max(record["parity"]["max_abs_diff"].values()) <= 1e-4
    images, sentences = _images(4), SENTENCES[:5]
    global_emb, regions = run("image_encoder", {"images": images.numpy()})
    want = engine.image_features(images)
    np.testing.assert_allclose(global_emb, want.global_emb.numpy(), atol=1e-4)
    np.testing.assert_allclose(regions, want.regions.numpy(), atol=1e-4)

    def tokens(texts):
        return _tokens(out / record["text"]["tokenizer"], texts, record["text"]["max_length"])

    text_emb, _ = run("text_encoder", tokens(sentences))
    np.testing.assert_allclose(text_emb, engine.embed_texts(sentences), atol=1e-4)
    # a side of several prompts averages the projections before normalising: the graph's second output
    side = CHEX5_REPORT_PROMPTS["Pleural Effusion"]["positive"]
    _, projections = run("text_encoder", tokens(side))
    want_side = engine.prompt_embeddings(CHEX5_REPORT_PROMPTS)["Pleural Effusion"][0].numpy()
    np.testing.assert_allclose(reduce_prompts(projections).numpy(), want_side, atol=1e-4)
    (scores,) = run("score", {"regions": regions, "text_embeddings": text_emb})
    text = torch.from_numpy(engine.embed_texts(sentences))
    with torch.no_grad():
        np.testing.assert_allclose(scores, engine.model.similarity(want, text).numpy(), atol=1e-4)
        cosines = engine.model.region_scores(want, text).flatten(2).numpy()
    assert scores.shape == (4, 5)
    np.testing.assert_allclose(scores, _lse_float64(cosines, record["head"]["gamma"]), atol=1e-4)


def test_torchscript_graphs_equal_pytorch(checkpoint, engine, tmp_path, capsys):
    from medclr.cli import main

    out = tmp_path / "ts"
    assert main(["export", "--checkpoint", str(checkpoint), "--format", "torchscript", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)  # stdout: where it went

    def run(name, inputs):
        module = torch.jit.load(str(out / f"{name}.pt"))
        with torch.no_grad():
            result = module(*(torch.from_numpy(v) for v in inputs.values()))
        return [t.numpy() for t in (result if isinstance(result, tuple) else (result,))]

    _check_graphs(out, engine, run)


def test_onnx_graphs_equal_pytorch_in_onnxruntime(checkpoint, engine, tmp_path):
    import onnxruntime as ort

    from medclr.export.exporter import export

    out = export(checkpoint, "onnx", tmp_path / "onnx")
    sessions = {}

    def run(name, inputs):
        sessions.setdefault(name, ort.InferenceSession(str(out / f"{name}.onnx"), providers=["CPUExecutionProvider"]))
        assert [i.name for i in sessions[name].get_inputs()] == list(inputs)
        return sessions[name].run(None, inputs)

    _check_graphs(out, engine, run)


@pytest.fixture(scope="module")
def eval_report(checkpoint, tmp_path_factory) -> Path:
    """A metrics.json as `medclr eval` writes it (the committed demo report's), naming this checkpoint."""
    metrics = json.loads((REPO / "docs" / "eval" / "metrics.json").read_text())
    metrics["checkpoint"] = str(checkpoint)
    folder = tmp_path_factory.mktemp("eval")
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def test_hf_folder_reloads_with_plain_tools(checkpoint, engine, eval_report, tmp_path):
    import torchvision
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    from medclr.export.exporter import export

    out = export(checkpoint, "hf", tmp_path / "hf", report=eval_report)
    config = json.loads((out / "config.json").read_text())
    pre, text_cfg = config["preprocessing"], config["text"]
    assert (pre["resize_shorter_side"], pre["centre_crop"]) == (RESIZE, SIZE)
    assert config["prompts"]["sets"]["Pneumothorax"]["positive"] == ["Pneumothorax"]

    # text: transformers' own classes, the projection as a plain matrix
    tok = AutoTokenizer.from_pretrained(out / text_cfg["folder"])
    bert = AutoModel.from_pretrained(out / text_cfg["folder"], add_pooling_layer=False).eval()
    proj = load_file(out / text_cfg["projection_weights"])
    texts = [s.rstrip(".?!").rstrip() for s in SENTENCES]
    batch = tok(texts, padding="longest", truncation=True, max_length=text_cfg["max_length"], return_tensors="pt")
    with torch.no_grad():
        cls = bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
    text_emb = torch.nn.functional.normalize(cls @ proj["weight"].T + proj["bias"], dim=-1)
    np.testing.assert_allclose(text_emb.numpy(), engine.embed_texts(SENTENCES), atol=1e-5)

    # image: torchvision's ResNet-18 with the trunk.* keys, the 1x1 projection, the mean, the normalisation
    state = load_file(out / config["image"]["weights"])
    resnet = torchvision.models.resnet18(weights=None)
    trunk = {k.removeprefix("trunk."): v for k, v in state.items() if k.startswith("trunk.")}
    missing, unexpected = resnet.load_state_dict(trunk, strict=False)
    assert sorted(missing) == ["fc.bias", "fc.weight"] and not unexpected
    resnet.fc = torch.nn.Identity()
    resnet.avgpool = torch.nn.Identity()
    resnet.eval()
    images = _images(3)
    mean = torch.tensor(pre["normalisation"]["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["normalisation"]["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        x = (images.expand(-1, 3, -1, -1) - mean) / std
        for name in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4"):
            x = getattr(resnet, name)(x)
        regions = torch.nn.functional.conv2d(x, state["proj.weight"], state["proj.bias"])
    want = engine.image_features(images)
    np.testing.assert_allclose(regions.numpy(), want.regions.numpy(), atol=1e-5)
    global_emb = torch.nn.functional.normalize(regions.mean(dim=(2, 3)), dim=-1)
    np.testing.assert_allclose(global_emb.numpy(), want.global_emb.numpy(), atol=1e-5)
    head = load_file(out / config["head_weights"])
    assert math.exp(float(head["log_gamma"])) == pytest.approx(config["head"]["gamma"])
    assert config["evaluation"]["path"] == str((eval_report / "metrics.json").resolve())


def test_model_card_names_its_metrics_and_says_phantom_is_not_for_clinical_use(checkpoint, eval_report, tmp_path):
    import hashlib

    from medclr.eval_report import read_metrics
    from medclr.export.exporter import export

    card = (export(checkpoint, "hf", tmp_path / "hf", report=eval_report) / "README.md").read_text()
    metrics_file = eval_report / "metrics.json"
    m = read_metrics(metrics_file)
    top = card.split("## Model")[0]
    assert "Not for clinical use" in top and "CXR-Phantom" in top
    assert f"`{metrics_file.resolve()}`" in card and hashlib.sha256(metrics_file.read_bytes()).hexdigest() in card
    lo, hi = m["zeroshot"]["macro"]["AUC_CI"]
    assert f"| {m['summary']['AUC']:.3f} | [{lo:.3f}, {hi:.3f}] |" in card
    cardio = m["zeroshot"]["per_class"]["Cardiomegaly"]
    assert f"| Cardiomegaly | {cardio['AUC']:.3f} [{cardio['AUC_CI'][0]:.3f}, {cardio['AUC_CI'][1]:.3f}]" in card
    assert f"| {m['grounding']['CNR_control']['macro']:.3f} (another phrase's map) |" in card
    assert "## Validation at the end of training" in card and "| Edema |" in card.split("## Validation")[1]
    assert "dcl_lm" in card and "30 of 30" in card  # training, from checkpoint_meta.json


def test_cli_teaches_and_refuses_in_one_line(checkpoint, eval_report, tmp_path, monkeypatch, capsys):
    from medclr.cli import main

    helped = subprocess.run([sys.executable, "-m", "medclr", "export", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0 and "{hf,onnx,torchscript}" in helped.stdout and "--report" in helped.stdout
    listed = subprocess.run([sys.executable, "-m", "medclr", "--help"], capture_output=True, text=True, timeout=120)
    assert any(line.split()[:2] == ["export", "export"] for line in listed.stdout.splitlines())  # its HELP, built
    bad = subprocess.run([sys.executable, "-m", "medclr", "export", "--checkpoint", str(checkpoint), "--format", "tflite",
                          "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "hf, onnx, torchscript" in bad.stderr

    def one_line(*args, needle):
        assert main(["export", *map(str, args)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err

    one_line("--checkpoint", tmp_path / "nowhere", "--format", "hf", "--out", tmp_path / "o", needle="no such directory")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    one_line("--checkpoint", checkpoint, "--format", "hf", "--out", tmp_path / "mine", needle="holds other files")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    one_line("--checkpoint", checkpoint, "--format", "onnx", "--out", tmp_path / "o", "--report", eval_report,
             needle="only --format hf")
    other = json.loads((eval_report / "metrics.json").read_text())
    other["checkpoint"] = str(tmp_path)  # an existing folder that is not this checkpoint
    (tmp_path / "other.json").write_text(json.dumps(other))
    one_line("--checkpoint", checkpoint, "--format", "hf", "--out", tmp_path / "o", "--report", tmp_path / "other.json",
             needle="not " + str(checkpoint))
    one_line("--checkpoint", checkpoint, "--format", "torchscript", "--out", tmp_path / "o", "--batch", 0,
             needle="--batch 0")  # fails inside the staging folder
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if the extra were not installed
    one_line("--checkpoint", checkpoint, "--format", "onnx", "--out", tmp_path / "o", needle="pip install 'medclr[export]'")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.export-*"))


def test_an_earlier_export_is_replaced_whole(checkpoint, eval_report, tmp_path):
    from medclr.export.exporter import export

    out = export(checkpoint, "hf", tmp_path / "hf")
    assert "No `medclr eval` report was given" in (out / "README.md").read_text()
    (out / "stale.txt").write_text("from the earlier export")
    export(checkpoint, "hf", out, report=eval_report)
    assert "Metrics from" in (out / "README.md").read_text() and not (out / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no staging or old folder left beside it


def test_cosine_head_graph_scores_the_global_embeddings(checkpoint, tmp_path):
    from medclr.export.exporter import export
    from medclr.inference import CheckpointMeta, load_checkpoint, weights_sha256, write_metadata
    from medclr.models.dual import DualEncoder
    from medclr.models.similarity import CosineHead

    model = DualEncoder.from_pretrained(checkpoint)
    model.head = CosineHead(model.joint_dim)
    model.save_pretrained(tmp_path / "cosine")
    write_metadata(tmp_path / "cosine", CheckpointMeta(image_size=SIZE, weights_sha256=weights_sha256(tmp_path / "cosine")))
    out = export(tmp_path / "cosine", "torchscript", tmp_path / "ts")
    graph = json.loads((out / "export.json").read_text())["graphs"]["score"]
    assert list(graph["inputs"]) == ["global_embedding", "text_embeddings"]
    engine = load_checkpoint(tmp_path / "cosine")
    images = engine.image_features(_images(3)).global_emb
    texts = torch.from_numpy(engine.embed_texts(SENTENCES[:4]))
    with torch.no_grad():
        scores = torch.jit.load(str(out / "score.pt"))(images, texts).numpy()
    np.testing.assert_allclose(scores, images.double().numpy() @ texts.double().numpy().T, atol=1e-5)
