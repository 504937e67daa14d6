"""Loss modules (infonce, siglip, dcl, dcl_lm, t_infonce) and the registry, against brute force."""

import functools
import math

import pytest
import torch

from medclr.errors import MedclrError
from medclr.losses import LOSSES, NUCLRLoss, build_loss
from medclr.losses.infonce import InfoNCELoss


def _emb(b=6, d=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=dtype)
    txt = img + 0.8 * torch.randn(b, d, generator=g, dtype=dtype)  # correlated pairs
    return img.requires_grad_(True), txt.requires_grad_(True)


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def _grads(fn, img, txt, extra=()):
    img = img.detach().clone().requires_grad_(True)
    txt = txt.detach().clone().requires_grad_(True)
    v = fn(img, txt)
    gs = torch.autograd.grad(v, (img, txt) + tuple(extra))
    return v.detach(), gs


# ---------------------------------------------------------------- brute force, from the papers
def bf_infonce(img, txt, tau):
    x, y = _unit(img), _unit(txt)
    B = x.shape[0]
    tot = 0.0
    for i in range(B):
        s_row = [torch.dot(x[i], y[j]) for j in range(B)]
        s_col = [torch.dot(x[j], y[i]) for j in range(B)]
        tot = tot - torch.log(torch.exp(s_row[i] / tau) / sum(torch.exp(s / tau) for s in s_row))
        tot = tot - torch.log(torch.exp(s_col[i] / tau) / sum(torch.exp(s / tau) for s in s_col))
    return tot / (2 * B)


def bf_dcl(img, txt, tau, eta, anchor="text"):
    """Rows = anchors: text-anchored rows only (the paper), or both directions averaged."""
    x, y = _unit(img), _unit(txt)
    B, N = x.shape[0], x.shape[0] - 1
    sims = (y @ x.T,) if anchor == "text" else (x @ y.T, y @ x.T)
    tot = 0.0
    for sim in sims:
        for i in range(B):
            pos = torch.exp(sim[i, i] / tau)
            neg = sum(torch.exp(sim[i, j] / tau) for j in range(B) if j != i)
            ng = torch.clamp((neg - N * eta[i] * pos) / (1 - eta[i]), min=N * math.exp(-1 / tau))
            tot = tot - torch.log(pos / (pos + ng))
    return tot / (len(sims) * B)


def bf_siglip(img, txt, t, b):
    x, y = _unit(img), _unit(txt)
    B = x.shape[0]
    tot = 0.0
    for i in range(B):
        for j in range(B):
            z = 1.0 if i == j else -1.0
            tot = tot - torch.log(1.0 / (1.0 + torch.exp(-z * (t * torch.dot(x[i], y[j]) + b))))
    return tot / B


def bf_t_infonce(img, txt, tau, nu, normalization, weight=None, normalize=True):
    x, y = (_unit(img), _unit(txt)) if normalize else (img, txt)
    B = x.shape[0]
    q = [[(1 + ((x[i] - y[j]) ** 2).sum() / (tau * nu)) ** (-(nu + 1) / 2) for j in range(B)] for i in range(B)]
    w = [1.0] * B if weight is None else [float(v) * B / float(weight.sum()) for v in weight]
    tot = 0.0
    if normalization == "global":  # Eq. 4.1: one normaliser over all pairs
        Z = sum(q[i][j] for i in range(B) for j in range(B))
        for i in range(B):
            tot = tot - w[i] * torch.log(q[i][i] / Z)
        return tot / B
    for i in range(B):
        tot = tot - w[i] * torch.log(q[i][i] / sum(q[i][j] for j in range(B)))
        tot = tot - w[i] * torch.log(q[i][i] / sum(q[j][i] for j in range(B)))
    return tot / (2 * B)


# ---------------------------------------------------------------- registry
def test_registry_names_and_unknown_name():
    assert set(LOSSES) == {"infonce", "siglip", "dcl", "dcl_lm", "sogclr", "nuclr", "decl", "t_infonce"}
    assert isinstance(build_loss("InfoNCE", tau=0.1), InfoNCELoss)
    assert isinstance(build_loss("nuclr", num_samples=10), NUCLRLoss)
    with pytest.raises(MedclrError, match="infonce.*t_infonce"):
        build_loss("simclr")
    with pytest.raises(MedclrError, match="bad arguments"):
        build_loss("infonce", temperature=0.1)


def test_input_validation():
    img, txt = _emb()
    with pytest.raises(MedclrError, match="same b x d"):
        build_loss("infonce")(img, txt[:4])
    with pytest.raises(MedclrError, match="eta"):
        build_loss("dcl_lm")(img, txt)
    with pytest.raises(MedclrError, match="index"):
        build_loss("nuclr", num_samples=10)(img, txt)
    with pytest.raises(MedclrError, match=r"\[0, 10\)"):
        build_loss("sogclr", num_samples=10)(img, txt, index=torch.arange(6) + 5)
    with pytest.raises(MedclrError, match="at least 2"):
        build_loss("infonce")(img[:1], txt[:1])


# ---------------------------------------------------------------- values and gradients
@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_infonce_module(tau):
    img, txt = _emb()
    loss = build_loss("infonce", tau=tau)
    v, g = _grads(loss, img, txt)
    vb, gb = _grads(lambda a, b: bf_infonce(a, b, tau), img, txt)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, gb):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("anchor", [None, "text", "symmetric"])
def test_dcl_and_dcl_lm_modules(anchor):
    kw = {} if anchor is None else {"anchor": anchor}
    bf_anchor = anchor or "text"  # the default is the paper's text anchor
    img, txt = _emb(seed=2)
    eta = torch.tensor([0.1, 0.0, 0.3, 0.05, 0.2, 0.12], dtype=torch.float64)
    v, g = _grads(build_loss("dcl", tau=0.5, eta=0.1, **kw), img, txt)
    vb, gb = _grads(lambda a, b: bf_dcl(a, b, 0.5, [0.1] * 6, bf_anchor), img, txt)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, gb):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    lm = build_loss("dcl_lm", tau=0.5, **kw)
    v, g = _grads(lambda a, b: lm(a, b, eta=eta), img, txt)
    vb, gb = _grads(lambda a, b: bf_dcl(a, b, 0.5, eta, bf_anchor), img, txt)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, gb):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    # eta = 0 everywhere: dcl_lm is infonce with the same anchor
    v0, _ = _grads(lambda a, b: lm(a, b, eta=torch.zeros(6)), img, txt)
    torch.testing.assert_close(v0, _grads(build_loss("infonce", tau=0.5, anchor=bf_anchor), img, txt)[0])


@pytest.mark.parametrize("learnable", [True, False])
def test_siglip_module(learnable):
    img, txt = _emb(seed=3)
    loss = build_loss("siglip", scale_init=5.0, bias_init=-2.0, learnable=learnable).double()
    params = tuple(loss.parameters())
    assert len(params) == (2 if learnable else 0)
    v, g = _grads(loss, img, txt, params)
    # the module stores log t in float32: compare at exactly the t it holds
    t = loss.log_scale.detach().exp().clone().requires_grad_(True)
    b = loss.bias.detach().clone().requires_grad_(True)
    vb, gb = _grads(lambda a, c: bf_siglip(a, c, t, b), img, txt, (t, b) if learnable else ())
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g[0], gb[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g[1], gb[1], rtol=1e-9, atol=1e-12)
    if learnable:  # d/d log t = t * d/dt
        torch.testing.assert_close(g[2], t.detach() * gb[2], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(g[3], gb[3], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("normalization", ["global", "anchor"])
@pytest.mark.parametrize("weighted", [False, True])
def test_t_infonce_module(normalization, weighted):
    img, txt = _emb(seed=4)
    weight = torch.tensor([1.0, 2.0, 0.5, 1.5, 1.0, 3.0], dtype=torch.float64) if weighted else None
    loss = build_loss("t_infonce", tau=0.7, t_df=5.0, normalization=normalization)
    v, g = _grads(lambda a, b: loss(a, b, weight=weight), img, txt)
    vb, gb = _grads(lambda a, b: bf_t_infonce(a, b, 0.7, 5.0, normalization, weight), img, txt)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, gb):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_t_infonce_euclidean_and_gaussian_limit():
    img, txt = _emb(seed=5)
    loss = build_loss("t_infonce", tau=2.0, t_df=1.0, normalize=False)
    v, g = _grads(loss, img, txt)
    vb, gb = _grads(lambda a, b: bf_t_infonce(a, b, 2.0, 1.0, "global", normalize=False), img, txt)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, gb):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    # nu -> inf: (1 + d^2/(tau nu))^{-(nu+1)/2} -> exp(-d^2 / (2 tau)) = exp((s - 1)/tau) on the
    # sphere, so the per-anchor form becomes InfoNCE at the same tau.
    big = build_loss("t_infonce", tau=0.5, t_df=1e7, normalization="anchor")
    torch.testing.assert_close(big(img, txt), build_loss("infonce", tau=0.5)(img, txt), rtol=1e-5, atol=1e-6)


def test_gradcheck_modules():
    img, txt = _emb(b=4, d=3, seed=6)
    eta = torch.tensor([0.1, 0.0, 0.2, 0.05], dtype=torch.float64)
    cases = [
        build_loss("infonce", tau=0.3),
        build_loss("infonce", tau=0.3, anchor="text"),
        build_loss("dcl", tau=0.3, eta=0.1),
        functools.partial(build_loss("dcl_lm", tau=0.3), eta=eta),
        functools.partial(build_loss("dcl_lm", tau=0.3, anchor="symmetric"), eta=eta),
        build_loss("siglip", learnable=False).double(),
        build_loss("t_infonce", tau=0.5),
        build_loss("t_infonce", tau=0.5, normalization="anchor"),
    ]
    for fn in cases:
        assert torch.autograd.gradcheck(fn, (img.detach().requires_grad_(), txt.detach().requires_grad_()))


def test_normalisation_inside_the_loss():
    img, txt = _emb(seed=7)
    for name in ("infonce", "dcl", "siglip", "t_infonce"):
        loss = build_loss(name).double()
        torch.testing.assert_close(loss(img, txt), loss(3.0 * img, 0.5 * txt))
        torch.testing.assert_close(loss(img, txt), loss(_unit(img), _unit(txt)))


# ---------------------------------------------------------------- numerics for every loss
def _near_one(b=32, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, d, generator=g)
    img = base + 1e-3 * torch.randn(b, d, generator=g)
    txt = base + 1e-3 * torch.randn(b, d, generator=g)
    return img.to(dtype).requires_grad_(True), txt.to(dtype).requires_grad_(True)


def _all_losses(tau=0.01):
    eta = torch.full((32,), 0.1)
    out = []
    for name in LOSSES:
        kw = {"tau": tau} if name not in ("siglip", "t_infonce") else {}
        if name in ("sogclr", "nuclr", "decl"):
            kw["num_samples"] = 64
        out.append((name, build_loss(name, **kw), eta))
    return out


@pytest.mark.parametrize("mode", ["float32", "bf16_autocast", "fp16_inputs"])
def test_every_loss_finite_at_tau_001_cosines_near_one(mode):
    dtype = torch.float16 if mode == "fp16_inputs" else torch.float32
    idx = torch.arange(32)
    for name, loss, eta in _all_losses():
        for _ in range(2):  # second step exercises the stored tables
            img, txt = _near_one(dtype=dtype)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16_autocast")):
                v = loss(img, txt, index=idx, eta=eta)
            v.backward()
            assert v.dtype == torch.float32, name
            assert torch.isfinite(v), name
            assert bool(torch.isfinite(img.grad).all()) and bool(torch.isfinite(txt.grad).all()), name
        for buf_name, buf in loss.named_buffers():
            if buf_name.startswith(("u_", "rate_")):
                seen = buf[idx]
                assert bool(torch.isfinite(seen).all()), (name, buf_name)
            elif buf.is_floating_point():
                assert bool(torch.isfinite(buf).all()), (name, buf_name)


def test_autocast_does_not_change_the_result():
    img, txt = _near_one()
    for name, loss, eta in _all_losses(tau=0.05):
        loss.eval()  # no table updates, no random draws: two calls must agree exactly
        ref = loss(img, txt, index=torch.arange(32), eta=eta)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            amp = loss(img, txt, index=torch.arange(32), eta=eta)
        assert torch.equal(ref, amp), name
