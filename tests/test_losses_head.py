"""Every loss on a similarity head's blocks (loss(sims=...)), in float64.

- LSE+NL: the loss on score_blocks(head.score, head.image_side(regions), text) equals the paper's
  formulas written out by hand here (non-local block, unit cells, normalised LSE pooling, then
  InfoNCE / DCL Eq. 6-8 / SigLIP / the Student-t kernel), on the same region features;
- the cosine head's blocks give bit-identical values and per-sample tables to the embeddings path
  (the loss the trainer used before heads were trained);
- gradcheck through head and loss on a small case.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from medclr.errors import MedclrError
from medclr.losses import build_loss
from medclr.losses.distributed import score_blocks
from medclr.models.image import ImageFeatures
from medclr.models.similarity import CosineHead, LSENLHead

B, D, H, W, GAMMA = 6, 8, 3, 2, 4.0


def _case(seed=0, b=B, d=D, h=H, w=W):
    g = torch.Generator().manual_seed(seed)
    regions = torch.randn(b, d, h, w, generator=g, dtype=torch.float64)
    text = torch.randn(b, d, generator=g, dtype=torch.float64)
    head = LSENLHead(d, gamma=GAMMA).double()
    with torch.no_grad():  # a non-identity non-local block (its output layer starts at zero)
        head.nl.out.weight.copy_(0.5 * torch.randn(d, d // 2, generator=g, dtype=torch.float64))
        head.nl.out.bias.copy_(0.1 * torch.randn(d, generator=g, dtype=torch.float64))
    return regions, text, head


def _features(regions):
    return ImageFeatures(regions, torch.nn.functional.normalize(regions.mean(dim=(2, 3)), dim=-1))


def lse_nl_by_hand(regions, text, head) -> np.ndarray:
    """s(x, y) = (1/g) log((1/N) sum_r exp(g cos(NL(x)_r, y))), NL = x + W_z softmax(th phi^T / sqrt k) g(x)."""
    x = regions.detach().numpy().reshape(B, D, H * W).transpose(0, 2, 1)  # B x N x D
    p = {k: v.detach().numpy() for k, v in head.state_dict().items()}
    th, ph, gx = x @ p["nl.theta.weight"].T, x @ p["nl.phi.weight"].T, x @ p["nl.g.weight"].T
    logits = th @ ph.transpose(0, 2, 1) / math.sqrt(th.shape[-1])
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    z = x + (att @ gx) @ p["nl.out.weight"].T + p["nl.out.bias"]
    cells = z / np.linalg.norm(z, axis=-1, keepdims=True)
    t = text.detach().numpy()
    t = t / np.linalg.norm(t, axis=-1, keepdims=True)
    cos = np.einsum("bnd,td->btn", cells, t)
    gamma = float(head.gamma)  # GAMMA as stored: log(gamma) is a float32 buffer before .double()
    assert gamma == pytest.approx(GAMMA, rel=1e-6)
    return np.log(np.mean(np.exp(gamma * cos), axis=-1)) / gamma


def _infonce(s, tau, anchor="symmetric"):
    rows = lambda m: -(np.diag(m) / tau - np.log(np.exp(m / tau).sum(1)))  # noqa: E731
    return rows(s.T).mean() if anchor == "text" else 0.5 * (rows(s).mean() + rows(s.T).mean())


def _dcl(s, tau, eta, anchor="text"):
    """s: images x sentences; "text" = the paper's rows, each sentence against all images (s.T)."""
    n = s.shape[0] - 1

    def rows(m):
        pos = np.exp(np.diag(m) / tau)
        neg = np.exp(m / tau).sum(1) - pos
        ng = np.maximum((neg - n * eta * pos) / (1 - eta), n * math.exp(-1 / tau))
        return -np.log(pos / (pos + ng))
    return rows(s.T).mean() if anchor == "text" else 0.5 * (rows(s).mean() + rows(s.T).mean())


def _siglip(s, t, b):
    z = 2 * np.eye(len(s)) - 1
    return -np.log(1 / (1 + np.exp(-z * (t * s + b)))).sum() / len(s)


def _t_infonce(s, tau, nu):
    lk = -(nu + 1) / 2 * np.log1p((2 - 2 * s) / (tau * nu))
    return -np.diag(lk).mean() + np.log(np.exp(lk).sum())


ETA = np.linspace(0.0, 0.25, B)
# case id -> (loss name, constructor kwargs, formula on the images x sentences matrix)
HAND = {
    "infonce": ("infonce", {"tau": 0.1}, lambda s: _infonce(s, 0.1)),
    "infonce_text": ("infonce", {"tau": 0.1, "anchor": "text"}, lambda s: _infonce(s, 0.1, "text")),
    "dcl": ("dcl", {"tau": 0.2, "eta": 0.1}, lambda s: _dcl(s, 0.2, 0.1)),
    "dcl_lm": ("dcl_lm", {"tau": 0.2}, lambda s: _dcl(s, 0.2, ETA)),
    "dcl_lm_symmetric": ("dcl_lm", {"tau": 0.2, "anchor": "symmetric"}, lambda s: _dcl(s, 0.2, ETA, "symmetric")),
    "siglip": ("siglip", {"scale_init": 5.0, "bias_init": -2.0}, None),  # formula with the loss's stored t and b
    "t_infonce": ("t_infonce", {"tau": 0.8}, lambda s: _t_infonce(s, 0.8, 5.0)),
}


@pytest.mark.parametrize("case", sorted(HAND))
def test_loss_on_lse_nl_blocks_equals_the_paper_formula(case):
    regions, text, head = _case()
    name, kw, formula = HAND[case]
    loss = build_loss(name, **kw).double()
    s_hand = lse_nl_by_hand(regions, text, head)
    sims = score_blocks(head.score, head.image_side(_features(regions)), text)
    np.testing.assert_allclose(sims[0].detach().numpy(), s_hand, rtol=1e-12, atol=1e-12)
    got = loss(sims=sims, eta=torch.as_tensor(ETA))
    if formula is None:
        t, b = float(loss.log_scale.detach().exp()), float(loss.bias.detach())
        formula = lambda s: _siglip(s, t, b)  # noqa: E731
    assert float(got.detach()) == pytest.approx(formula(s_hand), rel=1e-10, abs=1e-12)


STATEFUL = [("sogclr", {"num_samples": 12, "tau": 0.2, "gamma": 0.7}),
            ("nuclr", {"num_samples": 12, "tau": 0.2, "gamma": 0.7, "zeta_lr": 0.05}),
            ("decl", {"num_samples": 12, "tau": 0.3})]


@pytest.mark.parametrize("name, kw", [(n, kw) for n, kw, _ in HAND.values()] + STATEFUL,
                         ids=lambda v: v if isinstance(v, str) else "")
def test_cosine_blocks_give_exactly_the_embedding_numbers(name, kw):
    g = torch.Generator().manual_seed(3)
    img, txt = torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)
    index, eta = torch.tensor([0, 3, 5, 7, 9, 11]), torch.as_tensor(ETA, dtype=torch.float32)
    a, b = build_loss(name, **kw), build_loss(name, **kw)
    for _ in range(3):  # several steps: per-sample tables evolve identically
        va = a(img, txt, index=index, eta=eta)
        side = CosineHead().image_side(ImageFeatures(img[:, :, None, None], img))
        vb = b(sims=score_blocks(CosineHead().score, side, txt), index=index, eta=eta)
        assert torch.equal(va, vb), name
    for k, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[k]), (name, k)


@pytest.mark.parametrize("name, kw", [("infonce", {"tau": 0.1}), ("dcl_lm", {"tau": 0.2})])
def test_gradcheck_through_head_and_loss(name, kw):
    regions, text, head = _case(seed=1, b=4, d=4, h=2, w=2)  # small: gradcheck is 2 passes per input
    regions.requires_grad_(True)
    text.requires_grad_(True)
    loss = build_loss(name, **kw).double().eval()  # eval: per-sample tables do not move between calls
    index, eta = torch.arange(4) * 2, torch.as_tensor(ETA[:4])

    def through_head(r, t):
        return loss(sims=score_blocks(head.score, head.image_side(_features(r)), t), index=index, eta=eta)

    def through_nl_weight(w_out):
        return loss(sims=score_blocks(head.score, _side(head, regions.detach(), w_out), text.detach()), index=index,
                    eta=eta)

    assert torch.autograd.gradcheck(through_head, (regions, text), eps=1e-6, atol=1e-6)
    w = head.nl.out.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(through_nl_weight, (w,), eps=1e-6, atol=1e-6)


def _side(head, regions, w_out):
    """head.image_side with the non-local output weight as an explicit input (for gradcheck)."""
    x = regions.flatten(2).transpose(1, 2)
    y = torch.nn.functional.scaled_dot_product_attention(head.nl.theta(x), head.nl.phi(x), head.nl.g(x))
    z = x + y @ w_out.T + head.nl.out.bias
    return torch.nn.functional.normalize(z, dim=-1)


def test_bad_blocks_and_euclidean_t_infonce_are_one_line():
    regions, text, head = _case()
    sims = score_blocks(head.score, head.image_side(_features(regions)), text)
    with pytest.raises(MedclrError, match="sims"):
        build_loss("infonce")(sims=(sims[0], sims[1][:, :3]))
    with pytest.raises(MedclrError, match="not both"):
        build_loss("infonce")(text, text, sims=sims)
    with pytest.raises(MedclrError, match="normalize=False"):
        build_loss("t_infonce", normalize=False)(sims=sims)
