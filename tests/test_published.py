"""Published chest X-ray encoders load natively (issue 32): BioViL / BioViL-T image models and CXR-BERT.

The reference is hi-ml-multimodal's own classes (Microsoft's code for BioViL and BioViL-T), built with random
weights, saved the way that package saves them (``torch.save(ImageModel.state_dict())``; CXR-BERT's
``save_pretrained`` with the ``cxr-bert`` config and a tokenizer_config naming its remote tokenizer), then loaded by
medclr without that package and without remote code. Outputs must agree to 1e-5. Nothing is downloaded.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from medclr.errors import MedclrError

with warnings.catch_warnings():  # timm's deprecation notice on import
    warnings.simplefilter("ignore")
    from health_multimodal.image.model.model import ImageModel
    from health_multimodal.text.model import CXRBertConfig, CXRBertModel

WORDS = ("no yes there is a the small large right left pleural effusion pneumothorax heart size normal lungs are "
         "clear acute cardiopulmonary process focal consolidation edema").split()


def _biovil_file(tmp_path, encoder_type: str, seed: int = 0, joint: int = 128):
    """hi-ml's ImageModel with random weights and non-trivial BatchNorm statistics, saved as hi-ml saves it."""
    torch.manual_seed(seed)
    model = ImageModel(img_encoder_type=encoder_type, joint_feature_size=joint)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
    if hasattr(model.encoder, "missing_previous_emb"):
        torch.nn.init.normal_(model.encoder.missing_previous_emb)
    path = tmp_path / f"{encoder_type}.pt"
    torch.save(model.state_dict(), path)
    return model.eval(), path


@pytest.mark.parametrize("encoder_type, kind", [("resnet50", "biovil"), ("resnet50_multi_image", "biovil_t")])
def test_biovil_image_model_loads_with_equal_outputs(tmp_path, encoder_type, kind):
    from medclr.models import ImageEncoder

    reference, path = _biovil_file(tmp_path, encoder_type)
    encoder = ImageEncoder("resnet50", projector="mlp", pretrained="biovil", weights_path=path).eval()
    assert encoder.init == kind and encoder.input_norm == "none"
    images = torch.rand(2, 1, 160, 192, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = reference(images.expand(-1, 3, -1, -1))  # hi-ml's transform repeats the grey channel
        got = encoder(images)
    torch.testing.assert_close(got.regions, ref.projected_patch_embeddings, atol=1e-5, rtol=0)
    # BioViL's global embedding is the mean of the projected cells; medclr's is the same, normalised
    expected = torch.nn.functional.normalize(ref.projected_global_embedding, dim=-1)
    torch.testing.assert_close(got.global_emb, expected, atol=1e-5, rtol=0)

    # a medclr checkpoint of that encoder rebuilds it (the neck included) from its own config
    rebuilt = ImageEncoder.from_config(encoder.to_config())
    rebuilt.load_state_dict(encoder.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(images).regions, got.regions, atol=0, rtol=0)


def test_biovil_weights_refuse_a_different_encoder_in_one_line(tmp_path):
    from medclr.models import ImageEncoder

    _, path = _biovil_file(tmp_path, "resnet50")
    with pytest.raises(MedclrError, match=r"need model\.arch=resnet50 model\.projector=mlp") as err:
        ImageEncoder("resnet18", projector="linear", pretrained="biovil", weights_path=path)
    assert "\n" not in str(err.value)
    with pytest.raises(MedclrError, match="needs the weights file"):
        ImageEncoder("resnet50", projector="mlp", pretrained="biovil")
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "torchvision.pth")
    with pytest.raises(MedclrError, match="not a hi-ml-multimodal ImageModel"):
        ImageEncoder("resnet50", projector="mlp", pretrained="biovil", weights_path=tmp_path / "torchvision.pth")


def test_train_config_takes_biovil_weights(tmp_path):
    from medclr.training.config import load_config

    _, path = _biovil_file(tmp_path, "resnet50")
    run = ["train.max_steps=1", f"out={tmp_path}", f"data.manifest={tmp_path}/m.parquet"]
    cfg = load_config("infonce", ["model.image_pretrained=biovil", f"model.image_weights={path}", "model.projector=mlp",
                                  *run])
    assert cfg["model"]["image_weights"] == str(path) and cfg["model"]["input_norm"] == "auto"
    with pytest.raises(MedclrError, match="needs model.image_weights"):
        load_config("infonce", ["model.image_pretrained=biovil", *run])
    with pytest.raises(MedclrError, match="no such file"):
        load_config("infonce", [f"model.image_weights={tmp_path / 'missing.pt'}", *run])


def write_cxr_bert(folder, auto_tokenizer: str, max_length: int = 64):
    """A CXR-BERT folder as published (random weights, projection 32 wide): hi-ml's CXRBertModel.save_pretrained,
    vocab.txt and a tokenizer_config that names the repository's own CXRBertTokenizer (``auto_tokenizer``: its
    auto_map entry, which differs between a clone and a hub snapshot)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", ","]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(3)
    config = CXRBertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, projection_size=32, max_position_embeddings=64)
    model = CXRBertModel(config).eval()
    model.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "do_lower_case": True, "model_max_length": max_length, "tokenizer_class": "CXRBertTokenizer",
        "auto_map": {"AutoTokenizer": [auto_tokenizer, None]}}))
    return model


@pytest.fixture(scope="module")
def cxr_bert_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cxr_bert")
    model = write_cxr_bert(folder, "tokenization_cxrbert.CXRBertTokenizer")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "cxr-bert"
    return folder, model


def _tokens(folder, sentences):
    """Sentences of whole vocabulary words as ids by lookup in vocab.txt: [CLS] w... [SEP], padded with [PAD] (0).
    (transformers 5's ``BertTokenizer(vocab_file=...)`` silently maps every word to [UNK], so no tokenizer here.)"""
    vocab = (folder / "vocab.txt").read_text().split("\n")
    rows = [[vocab.index("[CLS]"), *(vocab.index(w) for w in s.split()), vocab.index("[SEP]")] for s in sentences]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def test_cxr_bert_text_tower_equals_the_original(cxr_bert_dir):
    from medclr.models import TextEncoder

    folder, reference = cxr_bert_dir
    encoder = TextEncoder.from_pretrained(folder, joint_dim=None, pooling="cls").eval()
    assert encoder.projection_kind == "cxrbert" and encoder.joint_dim == 32
    batch = _tokens(folder, ["no pleural effusion", "small left pneumothorax", "heart size is normal"])
    with torch.no_grad():
        ref = reference(batch["input_ids"], attention_mask=batch["attention_mask"], output_cls_projected_embedding=True)
        got = encoder(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(got.projected, ref.cls_projected_embedding, atol=1e-5, rtol=0)
    # the tokenizer medclr builds (no remote code) splits as the published vocabulary does
    assert encoder.tokenize(["no pleural effusion"])["input_ids"].tolist() == \
        _tokens(folder, ["no pleural effusion"])["input_ids"].tolist()


def test_cxr_bert_masked_lm_loads_natively(cxr_bert_dir):
    from medclr.lm import load_masked_lm

    folder, reference = cxr_bert_dir
    model, tokenizer = load_masked_lm(folder, device="cpu")  # no trust_remote_code
    batch = _tokens(folder, ["there is a small right pleural effusion", "lungs are clear"])
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, reference(**batch).logits, atol=1e-5, rtol=0)


def test_lm_score_with_a_cxr_bert_folder_end_to_end(cxr_bert_dir, tmp_path, capsys):
    """PLL and eta from CXR-BERT through `medclr lm score`, with the paper's a = 0.2, k = 0.35."""
    from transformers import BertTokenizerFast

    from medclr.cli import main
    from medclr.data.manifest import write_manifest
    from medclr.lm import pseudo_log_likelihood
    from medclr.lm.eta import read_eta_table

    folder, reference = cxr_bert_dir
    rows = [["No pleural effusion.", "Heart size is normal."], ["Small left pneumothorax."], ["Lungs are clear."]]
    manifest = tmp_path / "m.parquet"
    write_manifest(pd.DataFrame({"sentences": rows, "split": ["train"] * 3}), manifest)
    out = tmp_path / "eta.parquet"
    assert main(["lm", "score", "--manifest", str(manifest), "--model", str(folder), "--out", str(out),
                 "--a", "0.2", "--k", "0.35", "--no-progress", "--device", "cpu"]) == 0
    table, meta = read_eta_table(out)
    assert len(table) == 4 + 1 and meta["a"] == 0.2 and meta["k"] == 0.35
    assert table.set_index("sentence")["count"]["Pneumothorax."] == 0  # the short form training may show
    # PLL with the original class (hi-ml's CXRBertModel); the tokenizer is the vocabulary's (checked above)
    tokenizer = BertTokenizerFast.from_pretrained(folder)
    assert tokenizer(["lungs are clear"])["input_ids"] == _tokens(folder, ["lungs are clear"])["input_ids"].tolist()
    ref = pseudo_log_likelihood(table["sentence"].tolist(), reference, tokenizer, progress=False)
    np.testing.assert_allclose(table["pll"], ref, atol=1e-4)
    np.testing.assert_allclose(table["eta"], np.minimum(0.2 * np.exp(0.35 * table["pll"]), 0.5), rtol=1e-6)
    # the paper's a, k are also the default (cached PLLs: eta only)
    assert main(["lm", "score", "--manifest", str(manifest), "--model", str(folder), "--out", str(out),
                 "--no-progress", "--device", "cpu"]) == 0
    again, meta = read_eta_table(out)
    assert (meta["a"], meta["k"], meta["eta_params"]["source"]) == (0.2, 0.35, "paper")
    np.testing.assert_allclose(again["eta"], table["eta"], rtol=1e-12)


def test_a_run_starts_from_biovil_and_cxr_bert(cxr_bert_dir, tmp_path):
    """`medclr train` from BioViL's image file and a CXR-BERT folder: with no steps (train.max_steps=0) the checkpoint
    is BioViL + CXR-BERT as published, ready for `medclr eval`, the app and medclr.load."""
    from medclr.cli import main
    from medclr.data.manifest import write_manifest
    from medclr.data.readers.mimic import read_mimic_cxr_jpg
    from medclr.inference import load_checkpoint
    from medclr.models.biovil import read_biovil_weights
    from tests.test_training import TINY, write_tiny_mimic

    folder, reference = cxr_bert_dir
    root = write_tiny_mimic(tmp_path / "mimic")
    manifest = write_manifest(read_mimic_cxr_jpg(root), tmp_path / "manifest.parquet", root)
    _, weights = _biovil_file(tmp_path, "resnet50", joint=32)  # CXR-BERT's projection above is 32 wide
    out = tmp_path / "run"
    assert main(["train", "--config", "infonce", *TINY, f"data.manifest={manifest}", f"model.text={folder}",
                 f"out={out}", "model.arch=resnet50", "model.projector=mlp", "model.joint_dim=32",
                 "model.image_pretrained=biovil", f"model.image_weights={weights}", "model.pooling=cls",
                 "model.stages=4", "model.output_stride=32", "train.batch_size=8", "train.max_steps=0"]) == 0
    model = load_checkpoint(out).model
    assert model.image_encoder.init == "biovil" and model.image_encoder.input_norm == "none"
    mapped = read_biovil_weights(weights).state
    image_state = model.image_encoder.state_dict()
    assert all(torch.equal(image_state[k], v) for k, v in mapped.items())
    text_state = model.text_encoder.proj.state_dict()
    assert all(torch.equal(text_state[k], v) for k, v in reference.cls_projection_head.state_dict().items())
