"""medclr.models: encoders, heads, DualEncoder round trip, offline/remote-code rules.

Everything is built locally: a tiny BERT masked LM with a WordPiece tokenizer trained here, and a
checkpoint laid out like CXR-BERT (model_type "cxr-bert", auto_map, cls_projection_head, vocab.txt)
whose "remote code" files would leave a marker if anything imported them.
"""

from __future__ import annotations

import json
import math
import socket

import numpy as np
import pytest
import torch

from medclr.errors import MedclrError
from medclr.models import (
    CosineHead,
    DualEncoder,
    ImageEncoder,
    LSENLHead,
    TextEncoder,
    grid_size,
    lse_pool,
)
from medclr.models.image import cached_imagenet_weights

SENTENCES = [
    "There is a small left pleural effusion.",
    "No pneumothorax.",
    "Heart size is normal.",
    "Mild cardiomegaly is seen.",
    "The lungs are clear without focal consolidation.",
    "Right lower lobe opacity may represent pneumonia.",
    "No acute cardiopulmonary process.",
    "Stable appearance of the mediastinum.",
]
HIDDEN, JOINT = 32, 16


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def no_network(monkeypatch):
    """Record (and refuse) every attempt to open a connection or resolve a host name."""
    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args[:2]))
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return attempts


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=300, min_frequency=1, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    tk.train_from_iterator(SENTENCES * 4, trainer)
    cls_id, sep_id = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return BertTokenizerFast(
        tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _tiny_mlm(vocab_size: int, seed: int = 0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
    )
    return BertForMaskedLM(cfg).eval()


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    """A `medclr lm fit`-like output: BertForMaskedLM + its tokenizer in one directory."""
    d = tmp_path_factory.mktemp("mlm")
    tok = _train_tokenizer()
    tok.save_pretrained(d)
    _tiny_mlm(tok.vocab_size).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def cxr_bert_dir(tmp_path_factory, mlm_dir):
    """Files laid out as the CXR-BERT hub repo: cxr-bert config with auto_map, pytorch_model.bin
    holding bert.* + cls.* + cls_projection_head.*, vocab.txt and a remote CXRBertTokenizer."""
    d = tmp_path_factory.mktemp("cxrbert")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(mlm_dir)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (d / "vocab.txt").write_text("\n".join(t for t, _ in vocab) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CXRBertTokenizer", "do_lower_case": True, "model_max_length": 512,
        "auto_map": {"AutoTokenizer": ["tokenization_cxrbert.CXRBertTokenizer", None]},
    }))
    mlm = _tiny_mlm(len(vocab), seed=1)
    state = dict(mlm.state_dict())
    g = torch.Generator().manual_seed(2)
    p = JOINT
    head = {
        "dense_to_hidden.weight": torch.randn(p, HIDDEN, generator=g), "dense_to_hidden.bias": torch.randn(p, generator=g),
        "LayerNorm.weight": torch.rand(p, generator=g) + 0.5, "LayerNorm.bias": torch.randn(p, generator=g),
        "dense_to_output.weight": torch.randn(p, p, generator=g), "dense_to_output.bias": torch.randn(p, generator=g),
    }
    state.update({f"cls_projection_head.{k}": v for k, v in head.items()})
    torch.save(state, d / "pytorch_model.bin")
    cfg = mlm.config.to_dict()
    cfg.update(model_type="cxr-bert", architectures=["CXRBertModel"], projection_size=p, auto_map={
        "AutoConfig": "configuration_cxrbert.CXRBertConfig", "AutoModel": "modeling_cxrbert.CXRBertModel"})
    (d / "config.json").write_text(json.dumps(cfg))
    marker = d / "REMOTE_CODE_RAN"
    for name in ("configuration_cxrbert.py", "modeling_cxrbert.py", "tokenization_cxrbert.py"):
        (d / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise ImportError('remote code ran')\n")
    return d, mlm, head


# --- image encoder ------------------------------------------------------------------------------------


@pytest.mark.parametrize("hw", [(64, 64), (96, 160), (100, 70)])
def test_image_regions_grid_and_unit_global(hw):
    torch.manual_seed(0)
    enc = ImageEncoder("resnet18", joint_dim=JOINT, pretrained="none").eval()
    x = torch.rand(3, 1, *hw)
    with torch.no_grad():
        f = enc(x)
    h, w = grid_size(*hw)
    assert (h, w) == (math.ceil(hw[0] / 32), math.ceil(hw[1] / 32))
    assert f.regions.shape == (3, JOINT, h, w) and f.grid == (h, w)
    assert f.global_emb.shape == (3, JOINT)
    torch.testing.assert_close(f.global_emb.norm(dim=-1), torch.ones(3))
    # global = L2-normalised spatial mean of the projected regions (BioViL's convention)
    torch.testing.assert_close(f.global_emb, torch.nn.functional.normalize(f.regions.mean((2, 3)), dim=-1))
    # a 3-channel grey input is the same as the 1-channel one (repeated inside)
    with torch.no_grad():
        f3 = enc(x.expand(-1, 3, -1, -1))
    torch.testing.assert_close(f3.regions, f.regions)


@pytest.mark.parametrize("arch,stages,stride,channels", [("resnet18", 3, 16, 256), ("resnet18", 3, 8, 256),
                                                        ("resnet18", 4, 8, 512), ("resnet50", 3, 8, 1024)])
def test_image_stages_and_stride_set_the_grid_and_the_trunk(arch, stages, stride, channels):
    """A cut trunk ends at layer3 (no layer4 weights at all); each halving of the stride unstrides one
    more of the last kept stages; the config round trip rebuilds the same network."""
    torch.manual_seed(0)
    enc = ImageEncoder(arch, joint_dim=JOINT, pretrained="none", stages=stages, output_stride=stride).eval()
    assert enc.out_channels == channels
    assert ("layer4" in dict(enc.trunk.named_children())) == (stages == 4)
    x = torch.rand(2, 1, 64, 96)
    with torch.no_grad():
        f = enc(x)
    assert f.grid == grid_size(64, 96, stride) == (math.ceil(64 / stride), math.ceil(96 / stride))
    again = ImageEncoder.from_config(enc.to_config(), load_weights=False).eval()
    again.load_state_dict(enc.state_dict())  # strict: the same parameters, key for key
    with torch.no_grad():
        torch.testing.assert_close(again(x).regions, f.regions)
    with pytest.raises(MedclrError, match="at most 16 with stages=3"):
        ImageEncoder(arch, pretrained="none", stages=3, output_stride=32)


def test_image_resnet50_mlp_projector_and_bad_input():
    torch.manual_seed(0)
    enc = ImageEncoder("resnet50", joint_dim=8, projector="mlp", pretrained="none", input_norm="none").eval()
    assert enc.out_channels == 2048
    with torch.no_grad():
        f = enc(torch.rand(2, 1, 64, 96))
    assert f.regions.shape == (2, 8, 2, 3)
    with pytest.raises(MedclrError, match="B x 1 x H x W"):
        enc(torch.rand(1, 64, 64))
    with pytest.raises(MedclrError, match="resnet18"):
        ImageEncoder("vgg16")


def test_channels_last_same_outputs():
    torch.manual_seed(0)
    a = ImageEncoder("resnet18", joint_dim=JOINT, pretrained="none").eval()
    b = ImageEncoder("resnet18", joint_dim=JOINT, pretrained="none", channels_last=True).eval()
    b.load_state_dict(a.state_dict())
    assert b.trunk.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.rand(2, 1, 96, 96)
    with torch.no_grad():
        fa, fb = a(x), b(x)
    torch.testing.assert_close(fb.regions, fa.regions, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fb.global_emb, fa.global_emb, atol=1e-5, rtol=1e-4)
    assert fb.regions.is_contiguous()


def test_imagenet_weights_only_from_local_cache(tmp_path, monkeypatch, no_network):
    import torchvision

    def no_download(*a, **k):
        raise AssertionError("load_state_dict_from_url must not be called")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", no_download)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # torch.hub.get_dir() -> tmp_path/hub
    assert cached_imagenet_weights("resnet18") is None
    assert ImageEncoder("resnet18", pretrained="auto").init == "random"
    with pytest.raises(MedclrError, match="resnet18-f37072fd.pth"):
        ImageEncoder("resnet18", pretrained="imagenet")

    # Put a (fake, seeded) torchvision weight file where the hub cache keeps it.
    torch.manual_seed(3)
    ref = torchvision.models.resnet18(weights=None)
    ckpt = tmp_path / "hub" / "checkpoints"
    ckpt.mkdir(parents=True)
    torch.save(ref.state_dict(), ckpt / "resnet18-f37072fd.pth")
    enc = ImageEncoder("resnet18", pretrained="auto")
    assert enc.init == "imagenet" and enc.to_config()["init"] == "imagenet"
    assert torch.equal(enc.trunk.conv1.weight, ref.conv1.weight)
    assert torch.equal(enc.trunk.layer4[1].bn2.running_var, ref.layer4[1].bn2.running_var)
    assert ImageEncoder("resnet18", pretrained="none").init == "random"
    assert no_network == []


# --- text encoder -------------------------------------------------------------------------------------


def test_text_encoder_from_mlm_checkpoint(mlm_dir, no_network):
    from transformers import BertForMaskedLM

    enc = TextEncoder.from_pretrained(mlm_dir, joint_dim=JOINT).eval()
    mlm = BertForMaskedLM.from_pretrained(mlm_dir)
    # the encoder part of the masked LM, weight for weight; no pooler, no MLM head
    ref = mlm.bert.state_dict()
    got = enc.backbone.state_dict()
    assert set(got) == {k for k in ref if not k.startswith("pooler.")}
    assert all(torch.equal(got[k], ref[k]) for k in got)
    assert enc.backbone.pooler is None and enc.projection_kind == "linear"

    batch = enc.tokenize(SENTENCES[:3])
    with torch.no_grad():
        f = enc(**batch)
        hidden = mlm.bert(**batch).last_hidden_state
    L = batch["input_ids"].shape[1]
    assert f.embedding.shape == (3, JOINT) and f.tokens.shape == (3, L, JOINT)
    torch.testing.assert_close(f.embedding.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(f.projected, enc.proj(hidden[:, 0]))  # [CLS] pooling
    torch.testing.assert_close(f.tokens, enc.proj(hidden))
    # trailing . ? ! are stripped (CXR-BERT rule), so these two tokenise identically
    assert torch.equal(enc.tokenize("No pneumothorax.")["input_ids"], enc.tokenize("No pneumothorax")["input_ids"])
    emb = enc.encode(SENTENCES, batch_size=3)
    assert emb.shape == (len(SENTENCES), JOINT)
    torch.testing.assert_close(emb[:3], f.embedding)
    assert enc.encode([]).shape == (0, JOINT)

    mean_enc = TextEncoder.from_pretrained(mlm_dir, joint_dim=JOINT, pooling="mean").eval()
    with torch.no_grad():
        fm = mean_enc(**batch)
    m = batch["attention_mask"].unsqueeze(-1).float()
    torch.testing.assert_close(fm.projected, mean_enc.proj((hidden * m).sum(1) / m.sum(1)))
    assert no_network == []


def test_unreachable_hub_id_is_one_clear_error(tmp_path, no_network):
    for kwargs in ({}, {"cache_dir": tmp_path}):
        with pytest.raises(MedclrError) as err:
            TextEncoder.from_pretrained("medclr-test-org/no-such-model-7f3a", **kwargs)
        msg = str(err.value)
        assert "\n" not in msg and "no-such-model-7f3a" in msg
        assert "local model directory" in msg and "medclr lm fit" in msg
    with pytest.raises(MedclrError, match="no such directory"):
        TextEncoder.from_pretrained(str(tmp_path / "missing" / "lm"))
    with pytest.raises(MedclrError, match="no config.json"):
        TextEncoder.from_pretrained(tmp_path)
    assert no_network == []


def test_a_missing_hub_model_is_refused_before_the_image_tower_is_built(monkeypatch, no_network):
    """The advice names what works (a local folder, model.allow_network=true for training, which the config
    accepts), and comes before any weight is built."""
    import medclr.models.dual as dual
    from medclr.models import build_dual_encoder
    from medclr.training.config import load_config

    monkeypatch.setattr(dual, "ImageEncoder", lambda *a, **k: pytest.fail("the image tower was built first"))
    with pytest.raises(MedclrError) as err:
        build_dual_encoder("medclr-test-org/no-such-model-7f3a")
    assert "model.allow_network=true" in str(err.value) and "--allow-network" in str(err.value)
    cfg = load_config("infonce", ["model.allow_network=true", "model.trust_remote_code=false", "out=x", "data.manifest=m"])
    assert cfg["model"]["allow_network"] is True and cfg["model"]["trust_remote_code"] is False
    assert no_network == []


def test_trust_remote_code_never_implicit(tmp_path, mlm_dir, monkeypatch, no_network):
    import transformers

    # (a) a model type transformers does not know, with remote code: refused without the flag
    d = tmp_path / "custom"
    d.mkdir()
    marker = tmp_path / "RAN"
    (d / "config.json").write_text(json.dumps({
        "model_type": "medclr-custom", "hidden_size": 8,
        "auto_map": {"AutoConfig": "modeling_custom.Cfg", "AutoModel": "modeling_custom.Model"}}))
    (d / "modeling_custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(MedclrError, match=r"opt in \(trust_remote_code / --trust-remote-code\)"):
        TextEncoder.from_pretrained(d)
    assert not marker.exists()

    # (b) every transformers loader is called with trust_remote_code=False unless the caller asks
    seen: list[object] = []
    for cls in (transformers.AutoModel, transformers.AutoTokenizer, transformers.AutoConfig):
        orig = cls.from_pretrained.__func__

        def spy(klass, *a, _orig=orig, **k):
            seen.append(k.get("trust_remote_code", "absent"))
            return _orig(klass, *a, **k)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    TextEncoder.from_pretrained(mlm_dir, joint_dim=JOINT)
    assert seen and all(v is False or v == "absent" for v in seen), seen
    assert no_network == []


def test_cxr_bert_layout_loads_natively_with_its_projection(cxr_bert_dir, tmp_path, no_network):
    d, mlm, head = cxr_bert_dir
    enc = TextEncoder.from_pretrained(d, joint_dim=None).eval()  # joint dim taken from the head
    assert not (d / "REMOTE_CODE_RAN").exists()  # neither model nor tokenizer code was imported
    assert enc.joint_dim == JOINT and enc.projection_kind == "cxrbert"
    for k, v in head.items():
        assert torch.equal(enc.proj.state_dict()[k], v)
    ref = mlm.bert.state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in enc.backbone.state_dict().items())
    batch = enc.tokenize(["small left effusion", "no pneumothorax"])
    assert (batch["input_ids"] != 1).all()  # vocab.txt tokenizer: no [UNK] for words in the vocab
    with torch.no_grad():
        f = enc(**batch)
        cls_h = mlm.bert(**batch).last_hidden_state[:, 0]
    # CXR-BERT's get_projected_text_embeddings: head([CLS]) then L2 normalise
    x = torch.nn.functional.gelu(cls_h @ head["dense_to_hidden.weight"].T + head["dense_to_hidden.bias"])
    x = torch.nn.functional.layer_norm(x, (JOINT,), head["LayerNorm.weight"], head["LayerNorm.bias"], eps=1e-12)
    x = x @ head["dense_to_output.weight"].T + head["dense_to_output.bias"]
    torch.testing.assert_close(f.embedding, torch.nn.functional.normalize(x, dim=-1))
    # a joint dim that does not match the shipped head -> a fresh linear projection
    assert TextEncoder.from_pretrained(d, joint_dim=8).projection_kind == "linear"
    # a DualEncoder around it saves and reloads with the head and the vocab.txt tokenizer
    torch.manual_seed(0)
    dual = DualEncoder(ImageEncoder(joint_dim=JOINT, pretrained="none"), enc, CosineHead(JOINT)).eval()
    loaded = DualEncoder.from_pretrained(dual.save_pretrained(tmp_path / "ckpt")).eval()
    assert loaded.text_encoder.projection_kind == "cxrbert"
    assert loaded.to_config()["text"]["backbone"]["model_type"] == "bert"
    with torch.no_grad():
        assert torch.equal(loaded.encode_text(batch).embedding, dual.encode_text(batch).embedding)
    assert not (d / "REMOTE_CODE_RAN").exists()
    assert no_network == []


# --- similarity heads ---------------------------------------------------------------------------------


def test_lse_pool_limits_match_float64_brute_force():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(4, 5, 49, generator=g, dtype=torch.float64) * 2 - 1  # cosines in [-1, 1]
    smax, smean = s.max(-1).values, s.mean(-1)
    for gamma in (1e-4, 1e-2, 0.5, 5.0, 50.0, 500.0):  # exp(500) still fits a float64
        brute = torch.log(torch.exp(gamma * s).mean(-1)) / gamma  # the direct formula, float64
        # float64 stays float64 (the brute formula itself is ~1e-12 off at gamma = 1e-4)
        torch.testing.assert_close(lse_pool(s, gamma), brute, atol=1e-10, rtol=0)
        got = lse_pool(s.float(), gamma)
        assert got.dtype == torch.float32
        # float32 keeps ~1e-7 even at gamma = 1e-4, where a plain log(mean(exp)) loses it all
        torch.testing.assert_close(got.double(), brute, atol=2e-6, rtol=0)
        assert (got >= smean - 1e-3).all() and (got <= smax + 1e-6).all()
    # limits: gamma -> inf gives the max (within log(N)/gamma), gamma -> 0 the mean
    assert (lse_pool(s.float(), 1e4).double() - smax).abs().max() <= math.log(49) / 1e4 + 1e-5
    assert (lse_pool(s.float(), 1e-2).double() - smean).abs().max() < 1e-2
    # monotone in gamma, between the two
    vals = [lse_pool(s.float(), gm) for gm in (0.1, 1.0, 10.0, 100.0)]
    assert all((b >= a - 1e-6).all() for a, b in zip(vals, vals[1:]))
    # the max-shift is detached; the gradient is still exact (softmax(gamma * s) over regions)
    x = s[:2, :2, :6].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: lse_pool(t, 3.0), (x,))
    grad = torch.autograd.grad(lse_pool(x, 3.0).sum(), x)[0]
    torch.testing.assert_close(grad, torch.softmax(3.0 * x.detach(), -1))


def _features(b=3, grid=(3, 4), seed=0):
    from medclr.models import ImageFeatures

    g = torch.Generator().manual_seed(seed)
    regions = torch.randn(b, JOINT, *grid, generator=g)
    glob = torch.nn.functional.normalize(regions.mean((2, 3)), dim=-1)
    text = torch.nn.functional.normalize(torch.randn(5, JOINT, generator=g), dim=-1)
    return ImageFeatures(regions=regions, global_emb=glob), text


def test_heads_give_similarity_matrices_and_region_maps():
    img, text = _features()
    cos = CosineHead(JOINT)
    sim = cos(img, text)
    assert sim.shape == (3, 5) and sim.abs().max() <= 1 + 1e-6
    torch.testing.assert_close(sim, img.global_emb @ text.T)
    maps = cos.region_scores(img, text)
    assert maps.shape == (3, 5, 3, 4)
    cell = torch.nn.functional.normalize(img.regions[1, :, 2, 3], dim=0)
    torch.testing.assert_close(maps[1, 4, 2, 3], cell @ text[4])

    torch.manual_seed(0)
    lse = LSENLHead(JOINT, gamma=5.0)
    # NL output projection starts at zero: the head is plain LSE over per-cell cosines
    torch.testing.assert_close(lse(img, text), lse_pool(maps.flatten(2), 5.0))
    with torch.no_grad():
        lse.nl.out.weight.normal_()
    s2, m2 = lse(img, text), lse.region_scores(img, text)
    assert s2.shape == (3, 5) and m2.shape == (3, 5, 3, 4) and s2.abs().max() <= 1 + 1e-6
    torch.testing.assert_close(s2, lse_pool(m2.flatten(2), 5.0))
    assert not torch.allclose(m2, maps)  # the non-local block mixes regions
    # learned gamma receives a gradient
    learn = LSENLHead(JOINT, gamma=2.0, learn_gamma=True)
    learn(img, text).diagonal().sum().backward()
    assert learn.log_gamma.grad is not None and learn.log_gamma.grad.abs() > 0


# --- DualEncoder --------------------------------------------------------------------------------------


def _dual(mlm_dir, head="lse_nl", channels_last=False):
    from medclr.models import build_dual_encoder

    torch.manual_seed(0)
    m = build_dual_encoder(mlm_dir, joint_dim=JOINT, head=head, image_pretrained="none", channels_last=channels_last)
    if head == "lse_nl":
        with torch.no_grad():  # move away from the zero init so the NL weights matter in the check
            m.head.nl.out.weight.normal_(0, 0.1)
    return m


def test_save_load_round_trip_identical(tmp_path, mlm_dir, no_network):
    model = _dual(mlm_dir).eval()
    images = torch.rand(2, 1, 64, 96)
    with torch.no_grad():
        img, txt, sim = model(images, SENTENCES[:3])
        maps = model.region_scores(img, txt)
    out = model.save_pretrained(tmp_path / "ckpt")
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg == json.loads(json.dumps(model.to_config(), default=str))
    assert cfg["head"]["type"] == "lse_nl" and cfg["image"]["arch"] == "resnet18"

    loaded = DualEncoder.from_pretrained(out).eval()
    assert loaded.to_config() == model.to_config()
    with torch.no_grad():
        img2, txt2, sim2 = loaded(images, SENTENCES[:3])
        maps2 = loaded.region_scores(img2, txt2)
    for a, b in ((sim, sim2), (maps, maps2), (img.regions, img2.regions), (txt.embedding, txt2.embedding)):
        assert torch.equal(a, b)
    sd, sd2 = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)

    (out / "model.safetensors").unlink()
    with pytest.raises(MedclrError, match="model.safetensors"):
        DualEncoder.from_pretrained(out)
    assert no_network == []


def test_saves_of_the_same_state_are_byte_identical(tmp_path, mlm_dir, no_network):
    """Issue 46: two exact resumes gave equal tensors but model.safetensors files whose headers differed, so their
    SHA-256 did too: safetensors writes its metadata map (two keys) in a Rust HashMap's order, seeded anew for
    every map. Six saves of one model, of its prompt embeddings and of a loss state now give one file each,
    and the files load back to the same tensors."""
    import hashlib

    from safetensors.torch import load_file

    from medclr.inference.stored_prompts import PROMPTS_NAME, save_prompt_embeddings
    from medclr.losses import build_loss
    from medclr.prompts import CHEX5_PROMPTS
    from medclr.training.checkpoint import save_loss_state

    model = _dual(mlm_dir).eval()
    loss = build_loss("nuclr", num_samples=6)
    digests: dict[str, set[str]] = {"model": set(), "prompts": set(), "loss": set()}
    for i in range(6):
        out = model.save_pretrained(tmp_path / f"save{i}")
        save_prompt_embeddings(out, model, "0" * 64, CHEX5_PROMPTS)
        save_loss_state(loss, out / "loss_state.safetensors", {"loss": "nuclr", "num_samples": 6}, np.arange(6))
        for key, name in (("model", "model.safetensors"), ("prompts", PROMPTS_NAME), ("loss", "loss_state.safetensors")):
            digests[key].add(hashlib.sha256((out / name).read_bytes()).hexdigest())
    assert {k: len(v) for k, v in digests.items()} == {"model": 1, "prompts": 1, "loss": 1}
    state = load_file(str(tmp_path / "save5" / "model.safetensors"))
    own = model.state_dict()
    assert state and all(torch.equal(v, own[k]) for k, v in state.items())


def test_dual_cosine_channels_last_and_gradients(mlm_dir):
    a = _dual(mlm_dir, head="cosine")
    b = _dual(mlm_dir, head="cosine", channels_last=True)
    b.load_state_dict(a.state_dict())
    images = torch.rand(2, 1, 64, 64)
    a.eval(), b.eval()
    with torch.no_grad():
        sa, sb = a(images, SENTENCES[:2])[2], b(images, SENTENCES[:2])[2]
    torch.testing.assert_close(sa, sb, atol=1e-5, rtol=1e-4)
    assert sa.shape == (2, 2) and sa.abs().max() <= 1 + 1e-6

    model = _dual(mlm_dir).train()
    _, _, sim = model(images, SENTENCES[:2])
    torch.nn.functional.cross_entropy(sim / 0.07, torch.arange(2)).backward()
    for name in ("image_encoder.trunk.conv1.weight", "text_encoder.backbone.embeddings.word_embeddings.weight",
                 "head.nl.theta.weight", "text_encoder.proj.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_length_buckets_give_the_same_embeddings_and_gradients(pooling):
    """TextEncoder.embed(buckets=k): chunks of similar length, each padded to its own longest, are the one-padding
    embeddings (and gradients) up to float rounding; the attention mask keeps padding out of every real token."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    enc = TextEncoder(BertModel(cfg), joint_dim=8, pooling=pooling).double()
    lengths = torch.tensor([3, 17, 5, 9, 2, 30, 12, 7, 4, 21, 6, 11, 8, 3, 25, 10])
    ids = torch.randint(1, 50, (16, 30))
    mask = (torch.arange(30)[None] < lengths[:, None]).long()
    ids = ids * mask
    weights = torch.randn(16, 8, dtype=torch.float64)
    grads = []
    for buckets in (1, 4):
        enc.zero_grad()
        emb = enc.embed(ids, mask, buckets=buckets)
        (emb * weights).sum().backward()
        grads.append(enc.proj.weight.grad.clone())
        if buckets == 1:
            ref = emb.detach()
    assert torch.allclose(emb.detach(), ref, atol=1e-10) and torch.allclose(grads[0], grads[1], atol=1e-10)
