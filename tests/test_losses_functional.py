"""medclr.losses.functional: info_nce and dcl against the papers' formulas, written as plain loops."""

import math

import pytest
import torch

from medclr.errors import MedclrError
from medclr.losses import functional as Fn


def _unit(b, d, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=1)


def _sim(b=6, d=4, seed=0):
    return (_unit(b, d, seed) @ _unit(b, d, seed + 1).T).requires_grad_(True)


def brute_info_nce(sim, tau):
    B = sim.shape[0]
    total = 0.0
    for i in range(B):
        den = sum(torch.exp(sim[i, j] / tau) for j in range(B))
        total = total - torch.log(torch.exp(sim[i, i] / tau) / den)
    return total / B


def brute_dcl(sim, tau, eta):
    """Eq. 6-8 of the sample-specific debiasing paper with M = 1, N = B - 1, naive exps."""
    B = sim.shape[0]
    N = B - 1
    total = 0.0
    for i in range(B):
        e = float(eta[i]) if isinstance(eta, torch.Tensor) else float(eta)
        pos = torch.exp(sim[i, i] / tau)
        neg = sum(torch.exp(sim[i, j] / tau) for j in range(B) if j != i)
        ng = torch.maximum((neg - N * e * pos) / (1 - e), torch.tensor(N * math.exp(-1 / tau), dtype=sim.dtype))
        total = total - torch.log(pos / (pos + ng))
    return total / B


def _value_and_grad(fn, sim):
    sim = sim.detach().clone().requires_grad_(True)
    v = fn(sim)
    (g,) = torch.autograd.grad(v, sim)
    return v.detach(), g


@pytest.mark.parametrize("tau", [0.1, 0.5, 1.0])
def test_info_nce_matches_brute_force(tau):
    sim = _sim()
    v, g = _value_and_grad(lambda s: Fn.info_nce(s, tau), sim)
    vb, gb = _value_and_grad(lambda s: brute_info_nce(s, tau), sim)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, gb, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tau,eta", [(0.5, 0.1), (0.2, 0.05), (1.0, 0.3)])
def test_dcl_constant_eta_matches_brute_force(tau, eta):
    sim = _sim(seed=3)
    v, g = _value_and_grad(lambda s: Fn.dcl(s, tau, eta), sim)
    vb, gb = _value_and_grad(lambda s: brute_dcl(s, tau, eta), sim)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, gb, rtol=1e-9, atol=1e-12)


def test_dcl_per_sample_eta_matches_brute_force():
    sim = _sim(b=7, seed=5)
    eta = torch.tensor([0.0, 0.05, 0.1, 0.2, 0.3, 0.02, 0.15], dtype=torch.float64)
    v, g = _value_and_grad(lambda s: Fn.dcl(s, 0.5, eta), sim)
    vb, gb = _value_and_grad(lambda s: brute_dcl(s, 0.5, eta), sim)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, gb, rtol=1e-9, atol=1e-12)


def test_dcl_floor_branch_matches_brute_force():
    # A large eta makes the debiased sum negative for some rows: the N e^{-1/tau} floor binds.
    sim = _sim(b=6, seed=7)
    with torch.no_grad():
        sim.diagonal().add_(0.8)
        sim.clamp_(-1, 1)
    eta = 0.9
    B, tau = sim.shape[0], 0.5
    neg = torch.exp(sim / tau).sum(1) - torch.exp(sim.diagonal() / tau)
    debiased = (neg - (B - 1) * eta * torch.exp(sim.diagonal() / tau)) / (1 - eta)
    assert bool((debiased < (B - 1) * math.exp(-1 / tau)).any()), "test data must exercise the floor"
    v, g = _value_and_grad(lambda s: Fn.dcl(s, tau, eta), sim)
    vb, gb = _value_and_grad(lambda s: brute_dcl(s, tau, eta), sim)
    torch.testing.assert_close(v, vb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, gb, rtol=1e-9, atol=1e-12)


def test_dcl_eta_zero_is_info_nce():
    sim = _sim(b=9, seed=11)
    for tau in (0.01, 0.07, 0.5):
        v0, g0 = _value_and_grad(lambda s, tau=tau: Fn.dcl(s, tau, 0.0), sim)
        v1, g1 = _value_and_grad(lambda s, tau=tau: Fn.info_nce(s, tau), sim)
        torch.testing.assert_close(v0, v1, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g0, g1, rtol=1e-8, atol=1e-10)
        v2, _ = _value_and_grad(lambda s, tau=tau: Fn.dcl(s, tau, torch.zeros(9, dtype=torch.float64)), sim)
        torch.testing.assert_close(v0, v2)


def test_gradcheck_functional():
    sim = _sim(b=5, seed=13)
    eta = torch.tensor([0.05, 0.1, 0.0, 0.2, 0.15], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda s: Fn.info_nce(s, 0.3), (sim,))
    assert torch.autograd.gradcheck(lambda s: Fn.dcl(s, 0.3, eta), (sim,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_no_overflow_at_tau_001_with_cosines_near_one(dtype):
    # Every cosine within 1e-3 of 1: naive e^{s/0.01} = e^{100} would overflow float32.
    g = torch.Generator().manual_seed(0)
    sim = (1.0 - 1e-3 * torch.rand(16, 16, generator=g)).to(dtype).requires_grad_(True)
    for fn in (lambda s: Fn.info_nce(s, 0.01), lambda s: Fn.dcl(s, 0.01, 0.1),
               lambda s: Fn.dcl(s, 0.01, torch.full((16,), 0.3))):
        v = fn(sim)
        (grad,) = torch.autograd.grad(v, sim)
        assert v.dtype == torch.float32
        assert torch.isfinite(v) and bool(torch.isfinite(grad).all())


def test_bad_inputs_raise_one_line_errors():
    sim = _sim()
    with pytest.raises(MedclrError, match="square"):
        Fn.info_nce(sim[:, :3], 0.1)
    with pytest.raises(MedclrError, match="tau"):
        Fn.info_nce(sim, 0.0)
    with pytest.raises(MedclrError, match="eta"):
        Fn.dcl(sim, 0.1, 1.0)
    with pytest.raises(MedclrError, match="eta"):
        Fn.dcl(sim, 0.1, torch.full((6,), 1.2, dtype=torch.float64))
    with pytest.raises(MedclrError, match="shape"):
        Fn.dcl(sim, 0.1, torch.zeros(3))
    with pytest.raises(MedclrError, match="B >= 2"):
        Fn.info_nce(torch.ones(1, 1), 0.1)
