"""DCL anchored on text, as the DCL-eta_LM paper writes it (Eq. 6-8, Section 4, Fig. 5).

"Given a reference text x, we assign x+ to be the associated image ... and treat all unpaired images
in a batch as {x_n-}", M = 1 (v_1 = x+), eta(x) of that text. The reference below is the paper's
Fig. 5 pseudocode transcribed line by line in float64, with the lower bound of Eq. 7 on N g: e^{-gamma^2}
per negative, gamma^2 = 1/tau for unit vectors (s >= -1), the same floor as functional.dcl_rows.
"""

from __future__ import annotations

import math

import pytest
import torch

from medclr.errors import MedclrError
from medclr.losses import build_loss

B, D = 7, 5


def _emb(seed=0, b=B, d=D):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=torch.float64)
    txt = img + 0.8 * torch.randn(b, d, generator=g, dtype=torch.float64)
    txt[0] = img[0]  # one exact pair, s = 1: with a large eta its debiased negative sum hits the floor
    return img, txt


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def fig5(sim, tau, eta, floors=None):
    """Fig. 5, dcl_LM_loss, for every anchor row of `sim` (anchors x candidates, positive on the diagonal)."""
    B = sim.shape[0]
    N = B - 1
    losses = []
    for i in range(B):
        pos = torch.exp(sim[i, i] / tau)
        neg = sum(torch.exp(sim[i, j] / tau) for j in range(B) if j != i)
        debiased = (neg - N * eta[i] * pos) / (1 - eta[i])
        floor = N * math.exp(-1 / tau)
        if floors is not None:
            floors.append(bool(debiased < floor))
        losses.append(-torch.log(pos / (pos + torch.clamp(debiased, min=floor))))
    return sum(losses) / B


def text_anchored(img, txt, tau, eta, floors=None):
    """Reference text i against all images: rows of s(text_i, image_j)."""
    return fig5(_unit(txt) @ _unit(img).T, tau, eta, floors)


def image_anchored(img, txt, tau, eta):
    return fig5(_unit(img) @ _unit(txt).T, tau, eta)


def _value_and_grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    v = fn(*inputs)
    grads = torch.autograd.grad(v, inputs, allow_unused=True)
    return v.detach(), [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


ETAS = {
    "small": torch.tensor([0.0, 0.05, 0.1, 0.02, 0.15, 0.08, 0.12], dtype=torch.float64),
    "floor_binds": torch.tensor([0.9, 0.05, 0.3, 0.0, 0.6, 0.2, 0.45], dtype=torch.float64),
}


@pytest.mark.parametrize("tau", [0.05, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("etas", sorted(ETAS))
def test_dcl_lm_default_is_the_papers_fig5_anchored_on_text(tau, etas):
    eta = ETAS[etas]
    img, txt = _emb(seed=1)
    loss = build_loss("dcl_lm", tau=tau)
    assert loss.anchor == "text" and "anchor=text" in repr(loss)
    floors = []
    text_anchored(img, txt, tau, eta, floors)
    if etas == "floor_binds":  # the floor branch is exercised, not just the debiased one
        assert floors[0] and not all(floors), floors
    got = _value_and_grads(lambda a, b: loss(a, b, eta=eta), img, txt)
    _assert_same(got, _value_and_grads(lambda a, b: text_anchored(a, b, tau, eta), img, txt))
    # not the symmetric objective (which would also pull each image towards its own sentence as an anchor)
    sym = _value_and_grads(lambda a, b: 0.5 * (image_anchored(a, b, tau, eta) + text_anchored(a, b, tau, eta)),
                           img, txt)
    assert abs(float(got[0] - sym[0])) > 1e-6


@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_constant_eta_dcl_is_fig5_dcl_loss_anchored_on_text(tau):
    img, txt = _emb(seed=2)
    eta = torch.full((B,), 0.1, dtype=torch.float64)
    got = _value_and_grads(build_loss("dcl", tau=tau, eta=0.1), img, txt)
    _assert_same(got, _value_and_grads(lambda a, b: text_anchored(a, b, tau, eta), img, txt))


@pytest.mark.parametrize("tau", [0.05, 0.3])
def test_dcl_lm_on_similarity_blocks_uses_the_text_anchored_block_only(tau):
    g = torch.Generator().manual_seed(3)
    s_i2t = torch.tanh(torch.randn(B, B, generator=g, dtype=torch.float64))
    s_t2i = torch.tanh(torch.randn(B, B, generator=g, dtype=torch.float64) + 2 * torch.eye(B, dtype=torch.float64))
    eta = ETAS["floor_binds"]
    loss = build_loss("dcl_lm", tau=tau)
    got = _value_and_grads(lambda a, b: loss(sims=(a, b), eta=eta), s_i2t, s_t2i)
    want = _value_and_grads(lambda a, b: fig5(b, tau, eta) + 0 * a.sum(), s_i2t, s_t2i)
    _assert_same(got, want)
    assert torch.count_nonzero(got[1][0]) == 0  # no gradient into the image-anchored block
    # perturbing the image-anchored block leaves the text-anchored loss exactly unchanged
    bumped = s_i2t + 0.5 * torch.tanh(torch.randn(B, B, generator=g, dtype=torch.float64))
    assert torch.equal(loss(sims=(bumped, s_t2i), eta=eta), got[0])
    # ... but not the symmetric one
    sym = build_loss("dcl_lm", tau=tau, anchor="symmetric")
    assert not torch.equal(sym(sims=(bumped, s_t2i), eta=eta), sym(sims=(s_i2t, s_t2i), eta=eta))
    want_sym = _value_and_grads(lambda a, b: 0.5 * (fig5(a, tau, eta) + fig5(b, tau, eta)), s_i2t, s_t2i)
    _assert_same(_value_and_grads(lambda a, b: sym(sims=(a, b), eta=eta), s_i2t, s_t2i), want_sym)


@pytest.mark.parametrize("name", ["dcl", "dcl_lm"])
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_symmetric_option_is_the_mean_of_both_directions(name, tau):
    img, txt = _emb(seed=4)
    eta = ETAS["floor_binds"] if name == "dcl_lm" else torch.full((B,), 0.1, dtype=torch.float64)
    kw = {"eta": 0.1} if name == "dcl" else {}
    loss = build_loss(name, tau=tau, anchor="symmetric", **kw)
    assert "anchor=symmetric" in repr(loss)
    got = _value_and_grads(lambda a, b: loss(a, b, eta=eta), img, txt)
    want = _value_and_grads(lambda a, b: 0.5 * (image_anchored(a, b, tau, eta) + text_anchored(a, b, tau, eta)),
                            img, txt)
    _assert_same(got, want)


@pytest.mark.parametrize("tau", [0.05, 0.2, 1.0])
def test_text_anchored_infonce_is_text_anchored_dcl_at_eta_zero(tau):
    img, txt = _emb(seed=5)
    zero = torch.zeros(B, dtype=torch.float64)
    nce = build_loss("infonce", tau=tau, anchor="text")
    v_nce, g_nce = _value_and_grads(nce, img, txt)
    v_dcl, g_dcl = _value_and_grads(lambda a, b: build_loss("dcl_lm", tau=tau)(a, b, eta=zero), img, txt)
    torch.testing.assert_close(v_nce, v_dcl, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_nce, g_dcl):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # and it is -log softmax over the images for each reference text
    s = _unit(txt) @ _unit(img).T
    direct = -torch.log_softmax(s / tau, dim=1).diagonal().mean()
    torch.testing.assert_close(v_nce, direct, rtol=1e-12, atol=1e-12)
    # infonce keeps CLIP's symmetric default
    assert build_loss("infonce").anchor == "symmetric"
    sym = 0.5 * (direct - torch.log_softmax(s.T / tau, dim=1).diagonal().mean())
    torch.testing.assert_close(build_loss("infonce", tau=tau)(img, txt), sym, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["dcl", "dcl_lm", "infonce"])
@pytest.mark.parametrize("bad", ["image", "Text", "both", None, 1])
def test_bad_anchor_is_one_line(name, bad):
    with pytest.raises(MedclrError, match=r"anchor: expected one of 'text', 'symmetric', got") as exc:
        build_loss(name, anchor=bad)
    assert "\n" not in str(exc.value)


def test_training_configs_anchor_dcl_on_text(tmp_path):
    config = pytest.importorskip("medclr.training.config", reason="training/ not present in this checkout")
    (tmp_path / "eta.parquet").touch()  # dcl_lm's config check only asks that the eta table exists
    for name in ("dcl", "dcl_true", "dcl_lm"):
        cfg = config.load_config(name, ["data.manifest=m", "out=o", f"data.eta={tmp_path / 'eta.parquet'}"])
        assert cfg["loss"]["anchor"] == "text", name
        assert build_loss(cfg["loss"]["name"], **config.loss_kwargs(cfg)).anchor == "text", name
    cfg = config.load_config("dcl", ["data.manifest=m", "out=o", "loss.anchor=symmetric"])
    assert build_loss(cfg["loss"]["name"], **config.loss_kwargs(cfg)).anchor == "symmetric"
