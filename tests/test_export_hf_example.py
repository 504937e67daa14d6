"""docs/export.md's example of the Hugging Face folder without medclr runs as written (issue 46, item 9).

The page's two code blocks in "Hugging Face folder" are taken out of the page and executed unchanged, in a folder
where ``run/hf`` is a fresh `medclr export --format hf` of a small checkpoint of each kind medclr writes:

* ``cpu_small``: ResNet-18 cut after layer3 with both kept strided stages unstrided (output stride 8), mean pooling,
  the LSE+NL head (the example once pooled at [CLS] and crashed on this trunk);
* a ResNet-50 (Bottleneck blocks) at output stride 16, mean pooling, the cosine head;
* BioViL-T's image file and a CXR-BERT folder as published (stand-ins with random weights, ``tests.test_published``):
  the ``mlp`` projector, the neck, [CLS] pooling and CXR-BERT's projection head.

Its text embeddings, region cells, global embeddings and the head's scores must equal medclr's to 1e-5.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest_app import build_text_model
from tests.test_published import _biovil_file, cxr_bert_dir  # noqa: F401 - cxr_bert_dir is a fixture

DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"
SENTENCES = ["Small left pleural effusion.", "No pneumothorax."]  # the example's own


def doc_blocks() -> list[str]:
    section = DOC.read_text().split("### Hugging Face folder")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "docs/export.md's HF section should hold the plain-tools block and the medclr block"
    return blocks


def _non_trivial(model) -> None:
    """BatchNorm statistics and a non-local block unlike their initial values, so that a part built wrong (the
    statistics not loaded, the block skipped) shows in the outputs."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in model.image_encoder.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
        if hasattr(model.head, "nl"):
            model.head.nl.out.weight.copy_(torch.randn(model.head.nl.out.weight.shape, generator=g) * 0.2)


def _checkpoint(out: Path, text: Path, **model) -> Path:
    from medclr.inference import CheckpointMeta, weights_sha256, write_metadata
    from medclr.models.dual import build_dual_encoder

    torch.manual_seed(0)
    dual = build_dual_encoder(text, **model)
    if hasattr(dual.head, "trained"):
        dual.head.trained = True  # stands for a trained head (an untrained LSE+NL head is refused)
    _non_trivial(dual)
    dual.save_pretrained(out)
    write_metadata(out, CheckpointMeta(image_size=64, resize=72, weights_sha256=weights_sha256(out)))
    return out


KINDS = {
    "cpu_small": dict(arch="resnet18", joint_dim=32, stages=3, output_stride=8, pooling="mean", head="lse_nl",
                      image_pretrained="none"),
    "resnet50_stride16": dict(arch="resnet50", joint_dim=32, stages=4, output_stride=16, pooling="mean",
                              head="cosine", image_pretrained="none"),
    "biovil_t_cxr_bert": dict(arch="resnet50", joint_dim=32, projector="mlp", pooling="cls", head="cosine",
                              image_pretrained="biovil"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_documented_hf_example_runs_as_written(kind, tmp_path, monkeypatch, cxr_bert_dir):  # noqa: F811
    from medclr.export.exporter import export
    from medclr.inference import load_checkpoint

    model = dict(KINDS[kind])
    if kind == "biovil_t_cxr_bert":
        text = cxr_bert_dir[0]
        model["image_weights"] = _biovil_file(tmp_path, "resnet50_multi_image", joint=32)[1]
    else:
        text = build_text_model(str(tmp_path))
    ckpt = _checkpoint(tmp_path / "checkpoint", text, **model)
    export(ckpt, "hf", tmp_path / "run" / "hf")
    engine = load_checkpoint(ckpt)
    config = engine.model.image_encoder.to_config()
    assert (config["stages"], config["output_stride"]) == (model.get("stages", 4), model.get("output_stride", 32))
    assert engine.model.text_encoder.pooling == model["pooling"]

    monkeypatch.chdir(tmp_path)  # the example reads run/hf
    torch.manual_seed(0)
    ns: dict = {}
    plain, with_medclr = doc_blocks()
    exec(compile(plain, f"{DOC}:hf-plain", "exec"), ns)
    exec(compile(with_medclr, f"{DOC}:hf-medclr", "exec"), ns)

    np.testing.assert_allclose(ns["text_emb"].numpy(), engine.embed_texts(SENTENCES), atol=1e-5, rtol=0)
    want = engine.image_features(ns["images"])
    assert ns["regions"].shape == want.regions.shape
    np.testing.assert_allclose(ns["regions"].numpy(), want.regions.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ns["global_emb"].numpy(), want.global_emb.numpy(), atol=1e-5, rtol=0)
    with torch.no_grad():
        scores = engine.model.similarity(want, torch.from_numpy(engine.embed_texts(SENTENCES)))
    np.testing.assert_allclose(ns["scores"].numpy(), scores.numpy(), atol=1e-5, rtol=0)
    if model["head"] == "cosine":
        np.testing.assert_allclose((ns["global_emb"] @ ns["text_emb"].T).numpy(), scores.numpy(), atol=1e-5, rtol=0)
