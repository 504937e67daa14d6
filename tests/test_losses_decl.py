"""DeCL: Algorithm 1 (loss_1 with u ~ Gamma(1, rate), loss_2, lambda_t) written as loops."""

import math

import torch

from medclr.losses import DeCLLoss


def _emb(b, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=torch.float64)
    return img, img + 0.7 * torch.randn(b, d, generator=g, dtype=torch.float64)


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def brute_decl(img, txt, idx, tau, gamma, lam, e, rates):
    """Algorithm 1 with exponentiated similarities S = exp(cos/tau); rates: {index: m} per modality."""
    x, y = _unit(img), _unit(txt)
    B = x.shape[0]
    total, new = 0.0, {m: dict(r) for m, r in rates.items()}
    for k, (m, S) in enumerate((("img", torch.exp(x @ y.T / tau)), ("txt", torch.exp(y @ x.T / tau)))):
        for i in range(B):
            negs = [S[i, j] for j in range(B) if j != i]
            mean_neg = sum(negs) / (B - 1)
            old = rates[m].get(int(idx[i]))
            m_batch = float(mean_neg.detach())
            rate = m_batch if old is None else (1 - gamma) * old + gamma * m_batch
            new[m][int(idx[i])] = rate
            u = float(e[k, i]) / rate  # u_i ~ Gamma(1, rate): an Exp(1) draw divided by the rate
            loss_1 = u * mean_neg - torch.log(S[i, i])
            loss_2 = torch.log(sum(negs)) - torch.log(S[i, i])
            total = total + (lam * loss_1 + (1 - lam) * loss_2) / (2 * B)
    return total, new


def _value_grads(loss, img, txt, idx):
    img, txt = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
    v = loss(img, txt, index=idx)
    return (v.detach(),) + torch.autograd.grad(v, (img, txt))


def test_two_steps_match_algorithm_1():
    n, B, tau, gamma = 12, 6, 0.3, 0.6
    loss = DeCLLoss(num_samples=n, tau=tau, gamma=gamma, lambda0=0.8, lambda_decay_steps=2.0, seed=3)
    f32 = lambda v: math.exp(float(torch.tensor(math.log(v), dtype=torch.float32)))  # noqa: E731
    rates = {"img": {4: f32(2.0), 9: f32(0.5)}, "txt": {1: f32(3.0)}}
    with torch.no_grad():
        for m, r in rates.items():
            for k, v in r.items():
                loss.get_buffer(f"rate_{m}")[k] = math.log(v)
    for step, (idx, seed) in enumerate(((torch.tensor([4, 1, 0, 9, 7, 3]), 1), (torch.tensor([2, 4, 11, 1, 5, 6]), 2))):
        img, txt = _emb(B, seed=seed)
        v, gi, gt = _value_grads(loss, img, txt, idx)
        lam = 0.8 / (1 + step / 2.0)  # lambda_t decreasing
        bi, bt = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
        e = loss.draw_exponential(step, B)
        ref, rates = brute_decl(bi, bt, idx, tau, gamma, lam, e, rates)
        rgi, rgt = torch.autograd.grad(ref, (bi, bt))
        torch.testing.assert_close(v, ref.detach(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gi, rgi, rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(gt, rgt, rtol=1e-8, atol=1e-12)
        for m, r in rates.items():
            for k, val in r.items():
                assert math.isclose(float(loss.get_buffer(f"rate_{m}")[k].exp()), val, rel_tol=1e-6)
        assert int(loss.step) == step + 1
        rates = {m: {k: f32(val) for k, val in r.items()} for m, r in rates.items()}


def test_eval_is_deterministic_and_leaves_state_alone():
    loss = DeCLLoss(num_samples=8, tau=0.2, lambda0=0.5, lambda_decay_steps=None)
    img, txt = _emb(5, seed=4)
    idx = torch.arange(5)
    loss(img, txt, index=idx)
    before = {k: v.clone() for k, v in loss.state_dict().items()}
    loss.eval()
    a, b = loss(img, txt), loss(img, txt)  # eval needs no index
    assert torch.equal(a, b)
    for k, t in loss.state_dict().items():
        assert torch.equal(t, before[k]), k
    # eval: u = E[u] = 1/m with m the batch mean, so loss_1 = 1 - log S_ii
    s = _unit(img) @ _unit(txt).T / 0.2
    pos = s.diagonal()
    neg_i2t = torch.logsumexp(s - torch.diag(torch.full((5,), float("inf"))), 1)
    neg_t2i = torch.logsumexp(s.T - torch.diag(torch.full((5,), float("inf"))), 1)
    ref = 0.5 * (1 - pos).mean() + 0.25 * ((neg_i2t - pos).mean() + (neg_t2i - pos).mean())
    torch.testing.assert_close(a, ref, rtol=1e-12, atol=1e-12)


def test_seeded_sampling_and_resume():
    img, txt = _emb(6, seed=5)
    idx = torch.arange(6)
    runs = []
    for seed in (0, 0, 1):
        loss = DeCLLoss(num_samples=10, tau=0.1, seed=seed)
        runs.append(torch.stack([loss(img, txt, index=idx).detach() for _ in range(3)]))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    a = DeCLLoss(num_samples=10, tau=0.1, seed=0)
    a(img, txt, index=idx)
    b = DeCLLoss(num_samples=10, tau=0.1, seed=0)
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) == {"rate_img", "rate_txt", "step"}
    assert torch.equal(a(img, txt, index=idx), b(img, txt, index=idx))
    # the auxiliary draws are Exp(1) = Gamma(1, 1); u = draw / rate is then Gamma(1, rate)
    e = a.draw_exponential(0, 20000)
    assert abs(float(e.mean()) - 1) < 0.03 and abs(float(e.var()) - 1) < 0.08


def test_no_tables_and_tau_001_near_one():
    loss = DeCLLoss(tau=0.01)  # no num_samples: the rate is the current batch's mean
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 8, generator=g)
    img = (base + 1e-3 * torch.randn(16, 8, generator=g)).requires_grad_(True)
    txt = (base + 1e-3 * torch.randn(16, 8, generator=g)).requires_grad_(True)
    v = loss(img, txt)
    v.backward()
    assert torch.isfinite(v) and bool(torch.isfinite(img.grad).all()) and bool(torch.isfinite(txt.grad).all())
