"""NUCLR / SogCLR: one step against Eq. 12-15 and Algorithm 1 written as loops, the InfoNCE
limit, the Eq. 9 fixed point of zeta, table semantics (eval, duplicates, checkpoint)."""

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from medclr.errors import MedclrError
from medclr.losses import NUCLRLoss, SogCLRLoss, build_loss


def _emb(b, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=torch.float64)
    txt = img + 0.7 * torch.randn(b, d, generator=g, dtype=torch.float64)
    return img, txt


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def brute_nuclr_step(img, txt, idx, n, tau, gamma, lr, tables, tidx=None, centred=False):
    """One training step of NUCLR from the paper, float64 loops.

    tables: dict with linear u_img/u_txt (None entries = first visit), zeta_img/zeta_txt and
    xi_img/xi_txt as python floats per dataset index. Returns (value, surrogate, new tables);
    surrogate's autograd gradient is Eq. 15 / tau. Duplicated indices: new u averaged
    (linear), zeta gradients averaged -- the documented convention. ``tidx``: the keys of the text zeta
    (sentence-keyed NUCLR); default the dataset index, as every other table. ``centred``: each g_j minus the
    mean of g over the B positions (zeta_step="centred").
    """
    keys = {"img": idx, "txt": idx if tidx is None else tidx}  # zeta tables; u is always per dataset index
    x, y = _unit(img), _unit(txt)
    B = x.shape[0]
    c = (n - 1) / (B - 1)
    new = {k: dict(v) if isinstance(v, dict) else v for k, v in tables.items()}
    value, surrogate = 0.0, 0.0
    for anc, cand, sim in (("img", "txt", x @ y.T), ("txt", "img", y @ x.T)):
        zeta = [tables[f"zeta_{cand}"][int(j)] for j in keys[cand]]
        xi = tables[f"xi_{cand}"]
        phi = []  # phi_i(w, zeta; B) with the graph
        for i in range(B):
            phi.append(c * sum(torch.exp((sim[i, j] - sim[i, i] - zeta[j]) / tau) for j in range(B) if j != i))
        u_pos = []
        for i in range(B):
            old = tables[f"u_{anc}"].get(int(idx[i]))
            p = float(phi[i].detach())
            u_pos.append(p if old is None else (1 - gamma) * old + gamma * p)
        groups = {}
        for i in range(B):
            groups.setdefault(int(idx[i]), []).append(u_pos[i])
        u_new = [sum(groups[int(idx[i])]) / len(groups[int(idx[i])]) for i in range(B)]
        for k, vals in groups.items():
            new[f"u_{anc}"][k] = sum(vals) / len(vals)
        eps_xi = math.exp(-xi / tau)
        for i in range(B):
            value = value + math.log(1 + u_new[i] * math.exp(xi / tau)) / (2 * B)
            surrogate = surrogate + phi[i] / (eps_xi + u_new[i]) / (2 * B)
        # zeta step: g_j = 1 - [c * sum_{i != j} p_ij + p_jj], own zeta for the positive
        g = []
        for j in range(B):
            m = 0.0
            for i in range(B):
                den = math.exp(-zeta[i] / tau) + u_new[i]
                if i == j:
                    m += math.exp(-zeta[j] / tau) / den
                else:
                    m += c * math.exp((float((sim[i, j] - sim[i, i]).detach()) - zeta[j]) / tau) / den
            g.append(1.0 - m)
        if centred:
            g = [x - sum(g) / B for x in g]
        gg = {}
        for j in range(B):
            gg.setdefault(int(keys[cand][j]), []).append(g[j])
        for k, vals in gg.items():
            new[f"zeta_{cand}"][k] = tables[f"zeta_{cand}"][k] - lr * sum(vals) / len(vals)
        new[f"xi_{cand}"] = max(xi, max(new[f"zeta_{cand}"].values()))
    return value, surrogate, new


def _load_tables(loss, tables, n, n_txt=None):
    with torch.no_grad():
        for m in ("img", "txt"):
            size = n if m == "img" or n_txt is None else n_txt  # of the zeta table; u has n entries
            u = torch.full((n,), float("-inf"))
            for k, v in tables[f"u_{m}"].items():
                u[k] = math.log(v)
            loss.get_buffer(f"u_{m}").copy_(u)
            loss.get_buffer(f"zeta_{m}").copy_(torch.tensor([tables[f"zeta_{m}"][k] for k in range(size)]))
            loss.get_buffer(f"xi_{m}").fill_(tables[f"xi_{m}"])


def _value_grads(loss, img, txt, idx):
    img = img.clone().requires_grad_(True)
    txt = txt.clone().requires_grad_(True)
    v = loss(img, txt, index=idx)
    return (v.detach(),) + torch.autograd.grad(v, (img, txt))


@pytest.mark.parametrize("zeta_step", ["paper", "centred"])
@pytest.mark.parametrize("duplicates", [False, True])
def test_one_step_matches_the_paper(duplicates, zeta_step):
    n, B, tau, gamma, lr = 10, 6, 0.2, 0.7, 0.05
    img, txt = _emb(B, seed=1)
    idx = torch.tensor([3, 7, 0, 7, 9, 2]) if duplicates else torch.tensor([3, 7, 0, 5, 9, 2])
    g = torch.Generator().manual_seed(5)
    f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731  (tables are float32)
    zeta = {m: {k: f32(0.1 * float(torch.randn(1, generator=g))) for k in range(n)} for m in ("img", "txt")}
    u = lambda v: math.exp(f32(math.log(v)))  # noqa: E731  (u is stored as a float32 log)
    tables = {
        "u_img": {3: u(4.0), 7: u(2.5), 9: u(0.7)},  # 0, 2, 5 never visited: first visit takes phi
        "u_txt": {3: u(1.5), 0: u(3.0), 2: u(0.2), 7: u(9.0)},
        "zeta_img": zeta["img"], "zeta_txt": zeta["txt"],
        "xi_img": f32(max(zeta["img"].values()) + 0.01), "xi_txt": max(zeta["txt"].values()),
    }
    loss = NUCLRLoss(n, tau=tau, gamma=gamma, zeta_lr=lr, zeta_init=0.0, freeze_zeta_steps=0, zeta_step=zeta_step)
    _load_tables(loss, tables, n)
    v, gi, gt = _value_grads(loss, img, txt, idx)

    bi, bt = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
    value, surrogate, new = brute_nuclr_step(bi, bt, idx, n, tau, gamma, lr, tables, centred=zeta_step == "centred")
    bgi, bgt = torch.autograd.grad(surrogate, (bi, bt))
    torch.testing.assert_close(v, torch.tensor(value, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gi, bgi, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(gt, bgt, rtol=1e-8, atol=1e-12)
    for m in ("img", "txt"):
        for k, u in new[f"u_{m}"].items():
            assert math.isclose(float(loss.get_buffer(f"u_{m}")[k].exp()), u, rel_tol=1e-5), (m, k)
        for k in range(n):
            assert math.isclose(float(loss.get_buffer(f"zeta_{m}")[k]), new[f"zeta_{m}"][k], rel_tol=1e-5, abs_tol=1e-6)
        assert math.isclose(float(loss.get_buffer(f"xi_{m}")), new[f"xi_{m}"], rel_tol=1e-6, abs_tol=1e-7)
    assert int(loss.step) == 1


def test_sentence_keyed_text_tables_match_the_paper_step():
    """num_texts: the text zeta is indexed by the pair's sentence (two pairs drawing the same sentence share
    it), u and the image zeta by the dataset index; one step against the float64 loops."""
    n, n_txt, B, tau, gamma, lr = 10, 7, 6, 0.2, 0.7, 0.05
    img, txt = _emb(B, seed=2)
    idx = torch.tensor([3, 7, 0, 5, 9, 2])
    tidx = torch.tensor([4, 1, 4, 6, 0, 2])  # pairs 0 and 2 drew the same sentence
    g = torch.Generator().manual_seed(6)
    f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731
    u = lambda v: math.exp(f32(math.log(v)))  # noqa: E731
    tables = {"u_img": {3: u(4.0), 9: u(0.7)}, "u_txt": {0: u(1.5), 5: u(3.0)},
              "zeta_img": {k: f32(0.1 * float(torch.randn(1, generator=g))) for k in range(n)},
              "zeta_txt": {k: f32(0.1 * float(torch.randn(1, generator=g))) for k in range(n_txt)}}
    tables["xi_img"], tables["xi_txt"] = max(tables["zeta_img"].values()), max(tables["zeta_txt"].values())
    loss = NUCLRLoss(n, tau=tau, gamma=gamma, zeta_lr=lr, zeta_init=0.0, freeze_zeta_steps=0, num_texts=n_txt,
                     zeta_step="paper")
    assert loss.zeta_txt.shape == (n_txt,) and loss.zeta_img.shape == (n,) == loss.u_txt.shape
    _load_tables(loss, tables, n, n_txt)
    a, b = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
    v = loss(a, b, index=idx, text_index=tidx)
    gi, gt = torch.autograd.grad(v, (a, b))
    bi, bt = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
    value, surrogate, new = brute_nuclr_step(bi, bt, idx, n, tau, gamma, lr, tables, tidx=tidx)
    bgi, bgt = torch.autograd.grad(surrogate, (bi, bt))
    torch.testing.assert_close(v.detach(), torch.tensor(value, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gi, bgi, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(gt, bgt, rtol=1e-8, atol=1e-12)
    for m, size in (("img", n), ("txt", n_txt)):
        for k, val in new[f"u_{m}"].items():  # u per dataset index
            assert math.isclose(float(loss.get_buffer(f"u_{m}")[k].exp()), val, rel_tol=1e-5), (m, k)
        for k in range(size):
            assert math.isclose(float(loss.get_buffer(f"zeta_{m}")[k]), new[f"zeta_{m}"][k], rel_tol=1e-5,
                                abs_tol=1e-6), (m, k)
    for k in (3, 5):  # sentences no pair drew keep their zeta
        assert float(loss.zeta_txt[k]) == tables["zeta_txt"][k]
    with pytest.raises(MedclrError, match="text_index"):
        loss(img, txt, index=idx)
    with pytest.raises(MedclrError, match=r"\[0, 7\)"):
        loss(img, txt, index=idx, text_index=torch.tensor([0, 1, 2, 3, 4, 7]))
    # every other loss ignores text_index (a trainer passes it to all)
    assert torch.isfinite(build_loss("infonce")(img, txt, index=idx, text_index=tidx))


def test_zeta_step_is_n_times_eq14_on_a_full_batch():
    # B = n: the implemented g_j equals n * G(zeta_j) of Eq. 14 exactly.
    n = B = 7
    tau, lr = 0.3, 0.1
    img, txt = _emb(B, seed=2)
    idx = torch.arange(n)
    loss = NUCLRLoss(n, tau=tau, gamma=1.0, zeta_lr=lr, zeta_init=0.02)
    z0 = loss.zeta_txt.clone().double()
    loss(img, txt, index=idx)
    x, y = _unit(img), _unit(txt)
    s = x @ y.T
    d = s - s.diagonal()[:, None]
    phi = torch.stack([sum(torch.exp((d[i, j] - z0[j]) / tau) for j in range(B) if j != i) for i in range(B)])
    eps = torch.exp(-z0 / tau)
    # Eq. 14: G_j = 1/B sum_i tau/(eps_i + u_i) * d/dzeta_j (eps_i + phi_i) + 1/n
    G = torch.zeros(n, dtype=torch.float64)
    for j in range(n):
        acc = 0.0
        for i in range(B):
            deriv = -eps[j] / tau if i == j else -torch.exp((d[i, j] - z0[j]) / tau) / tau
            acc = acc + tau / (eps[i] + phi[i]) * deriv
        G[j] = acc / B + 1.0 / n
    torch.testing.assert_close(loss.zeta_txt.double(), (z0 - lr * n * G), rtol=1e-5, atol=1e-6)


def test_gradient_is_infonce_on_full_batch_with_frozen_zero_zeta():
    n = B = 8
    tau = 0.1
    img, txt = _emb(B, seed=3)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    loss = NUCLRLoss(n, tau=tau, gamma=1.0, zeta_lr=0.5, zeta_init=0.0, xi_init=0.0, freeze_zeta_steps=10**9)
    v, gi, gt = _value_grads(loss, img, txt, idx)
    # Along tau * sum_i log sum_j exp((s_ij - s_ii)/tau), image- and text-anchored (loops):
    bi, bt = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
    s = _unit(bi) @ _unit(bt).T
    f_i2t = tau * sum(torch.log(sum(torch.exp((s[i, j] - s[i, i]) / tau) for j in range(B))) for i in range(B))
    f_t2i = tau * sum(torch.log(sum(torch.exp((s[j, i] - s[i, i]) / tau) for j in range(B))) for i in range(B))
    fi, ft = torch.autograd.grad(f_i2t + f_t2i, (bi, bt))
    ours = torch.cat([gi.flatten(), gt.flatten()])
    ref = torch.cat([fi.flatten(), ft.flatten()])
    cos = torch.dot(ours, ref) / (ours.norm() * ref.norm())
    assert float(cos) > 1 - 1e-12
    torch.testing.assert_close(ours, ref / (2 * n * tau), rtol=1e-9, atol=1e-12)  # nats, mean of two directions
    # ... which is exactly the InfoNCE loss, value and gradient.
    ref_v, ri, rt = _value_grads(build_loss("infonce", tau=tau), img, txt, idx)
    torch.testing.assert_close(v, ref_v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gi, ri, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gt, rt, rtol=1e-9, atol=1e-12)
    # SogCLR (NUCLR with zeta = xi = 0) is the same loss
    sog = _value_grads(SogCLRLoss(n, tau=tau, gamma=1.0), img, txt, idx)
    for a, b in zip(sog, (v, gi, gt)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_zeta_reaches_the_eq9_fixed_point():
    n = B = 12
    tau = 0.1
    img, txt = _emb(B, d=6, seed=4)
    idx = torch.arange(n)
    loss = NUCLRLoss(n, tau=tau, gamma=1.0, zeta_lr=0.08, zeta_init=-0.05, freeze_zeta_steps=3)
    with torch.no_grad():
        for _ in range(600):
            loss(img, txt, index=idx)
    s = _unit(img) @ _unit(txt).T
    for sim, zeta in ((s, loss.zeta_txt.double()), (s.T, loss.zeta_img.double())):
        # Eq. 9 with q = exp(zeta/tau): q_j = sum_j' exp(E_j'j/tau) / sum_i' exp(E_j'i'/tau) / q_i'
        q = torch.exp(zeta / tau)
        rhs = torch.stack([
            sum(torch.exp(sim[jp, j] / tau) / sum(torch.exp(sim[jp, ip] / tau) / q[ip] for ip in range(n)) for jp in range(n))
            for j in range(n)
        ])
        torch.testing.assert_close(rhs / q, torch.ones(n, dtype=torch.float64), rtol=0, atol=2e-4)
        # i.e. every candidate receives total softmax mass 1
        mass = torch.softmax((sim - zeta[None, :]) / tau, dim=1).sum(0)
        torch.testing.assert_close(mass, torch.ones(n, dtype=torch.float64), rtol=0, atol=2e-4)
    assert float(loss.xi_txt) >= float(loss.zeta_txt.max()) and float(loss.xi_img) >= float(loss.zeta_img.max())


def test_stale_u_drifts_every_visited_zeta_down_unless_centred():
    """Every candidate alike (one embedding for all) and u stale (20x phi, as while phi falls in training):
    every mass is low, so the paper step pushes every visited zeta down, most the most visited (sample 0 is in
    every batch, the others once a round); the centred step keeps the mean of zeta where it was (its steps
    sum to zero over a batch) and moves each zeta less."""
    n, B, tau = 10, 4, 0.1
    phi = (n - 1) * math.exp(0.05 / tau)  # d = 0, zeta = -0.05: phi of every anchor
    zetas = {}
    for zeta_step in ("paper", "centred"):
        loss = NUCLRLoss(n, tau=tau, gamma=0.8, zeta_lr=0.05, zeta_init=-0.05, freeze_zeta_steps=0,
                         zeta_step=zeta_step)
        with torch.no_grad():
            for m in ("img", "txt"):
                loss.get_buffer(f"u_{m}").fill_(math.log(20 * phi))
        same = torch.ones(B, 3, dtype=torch.float64)
        for _ in range(3):
            for batch in ([0, 1, 2, 3], [0, 4, 5, 6], [0, 7, 8, 9]):
                loss(same, same, index=torch.tensor(batch))
        zetas[zeta_step] = (loss.zeta_txt.double(), loss.zeta_img.double())
    for paper, centred in zip(*zetas.values()):
        assert float(paper.max()) < -0.05 - 0.04 and int(paper.argmin()) == 0
        assert abs(float(centred.mean()) + 0.05) < 1e-6
        assert float((centred + 0.05).abs().max()) < 0.1 * float((paper + 0.05).abs().min())


def test_freeze_step_counter_and_running_max_xi():
    n, B = 20, 6
    img, txt = _emb(B, seed=5)
    loss = NUCLRLoss(n, tau=0.1, gamma=0.8, zeta_lr=0.2, zeta_init=-0.05, freeze_zeta_steps=2, xi_init=0.0)
    idx = torch.tensor([1, 4, 6, 9, 13, 17])
    for _ in range(2):
        loss(img, txt, index=idx)
        assert torch.all(loss.zeta_txt == -0.05) and float(loss.xi_txt) == 0.0
    history = [0.0]
    for _ in range(4):
        loss(img, txt, index=idx)
        # xi_{t+1} = max(xi_t, max_j zeta_{t+1}^{(j)}): a running max, never below any zeta
        assert float(loss.xi_txt) == max(history[-1], float(loss.zeta_txt.max()))
        history.append(float(loss.xi_txt))
    assert not torch.all(loss.zeta_txt[idx] == -0.05)
    assert torch.all(loss.zeta_txt[[0, 2, 3]] == -0.05)  # not in the batch: untouched
    assert history == sorted(history) and history[-1] > 0.0 and int(loss.step) == 6


@pytest.mark.parametrize("cls", ["nuclr", "sogclr"])
def test_tables_do_not_change_in_eval(cls):
    n = 10
    img, txt = _emb(6, seed=6)
    idx = torch.tensor([0, 1, 1, 5, 8, 9])
    loss = build_loss(cls, num_samples=n, tau=0.1)
    loss(img, txt, index=idx)  # populate
    before = {k: v.clone() for k, v in loss.state_dict().items()}
    loss.eval()
    v = loss(img, txt, index=idx)
    assert torch.isfinite(v)
    for k, t in loss.state_dict().items():
        assert torch.equal(t, before[k]), k


def test_state_dict_round_trip_and_resume(tmp_path):
    n = 16
    make = lambda: NUCLRLoss(n, tau=0.05, gamma=0.8, zeta_lr=0.05, freeze_zeta_steps=1)  # noqa: E731
    a = make()
    gen = torch.Generator().manual_seed(7)
    batches = [(_emb(6, seed=10 + k), torch.randperm(n, generator=gen)[:6]) for k in range(4)]
    for (img, txt), idx in batches[:3]:
        a(img, txt, index=idx)
    sd = a.state_dict()
    assert {"u_img", "u_txt", "zeta_img", "zeta_txt", "xi_img", "xi_txt", "step"} <= set(sd)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "loss_state.safetensors"))
    b = make()
    b.load_state_dict(load_file(str(tmp_path / "loss_state.safetensors")))
    for k in sd:
        assert torch.equal(sd[k], b.state_dict()[k]), k
    (img, txt), idx = batches[3]
    ra, rb = _value_grads(a, img, txt, idx), _value_grads(b, img, txt, idx)
    for x, y in zip(ra, rb):
        assert torch.equal(x, y)
    for k in sd:
        assert torch.equal(a.state_dict()[k], b.state_dict()[k]), k
    assert set(SogCLRLoss(n).state_dict()) == {"u_img", "u_txt", "step"}


def test_duplicate_indices_are_deterministic():
    n = 8
    img, txt = _emb(6, seed=8)
    idx = torch.tensor([2, 5, 2, 2, 7, 5])
    outs = []
    for _ in range(2):
        loss = NUCLRLoss(n, tau=0.1, gamma=0.5, zeta_lr=0.1)
        for _ in range(3):
            r = _value_grads(loss, img, txt, idx)
        outs.append((r, {k: v.clone() for k, v in loss.state_dict().items()}))
    for x, y in zip(outs[0][0], outs[1][0]):
        assert torch.equal(x, y)
    for k in outs[0][1]:
        assert torch.equal(outs[0][1][k], outs[1][1][k])


# --------------------------------------------------------------------------- trainer hooks: freeze and zeta schedule


def _cosine_lr(base, t, freeze, total):
    """The paper's zeta step size, written out: base until the freeze ends, then base/2 (1 + cos(pi x progress))."""
    if t < freeze:
        return base
    return base / 2 * (1 + math.cos(math.pi * min(1.0, (t - freeze) / (total - freeze))))


def test_hooks_freeze_in_epochs_and_cosine_zeta_schedule_match_the_closed_form():
    """configure() turns 1.5 epochs of 2 steps into a 3-step freeze; on_step() sets the cosine step sizes.
    A twin loss given the closed-form step sizes by hand must end with the same tables, step by step."""
    n, spe, total, freeze = 12, 2, 9, 3
    kw = dict(tau=0.1, gamma=0.8, zeta_lr=0.05, zeta_lr_img=0.03, zeta_init=-0.05)
    hooked = NUCLRLoss(n, freeze_zeta_epochs=1.5, zeta_lr_schedule="cosine", **kw)
    assert hooked.configure(num_samples=n, steps_per_epoch=spe, total_steps=total) == []
    assert hooked.freeze_zeta_steps == freeze
    twin = NUCLRLoss(n, freeze_zeta_steps=freeze, **kw)
    gen = torch.Generator().manual_seed(3)
    for t in range(total):
        img, txt = _emb(6, seed=20 + t)
        idx = torch.randperm(n, generator=gen)[:6]
        hooked.on_step(t, total)
        twin.zeta_lr, twin.zeta_lr_img = _cosine_lr(0.05, t, freeze, total), _cosine_lr(0.03, t, freeze, total)
        assert hooked.zeta_lr == pytest.approx(twin.zeta_lr, rel=1e-14, abs=1e-18)
        assert hooked.zeta_lr_img == pytest.approx(twin.zeta_lr_img, rel=1e-14, abs=1e-18)
        hooked(img, txt, index=idx)
        twin(img, txt, index=idx)
        for k, v in twin.state_dict().items():
            torch.testing.assert_close(hooked.state_dict()[k], v, rtol=1e-12, atol=1e-12)
        frozen = bool(torch.all(hooked.zeta_txt == -0.05) and torch.all(hooked.zeta_img == -0.05))
        assert frozen == (t < freeze), t  # zeta first moves at step `freeze`
    assert hooked.zeta_lr == pytest.approx(0.05 / 2 * (1 + math.cos(math.pi * 5 / 6)))  # the last step's size
    # the default schedule is constant: on_step leaves the step sizes alone
    const = NUCLRLoss(n, **kw)
    const.on_step(5, total)
    assert (const.zeta_lr, const.zeta_lr_img, const.freeze_zeta_steps) == (0.05, 0.03, 0)


def test_hooked_schedule_resumes_exactly(tmp_path):
    """A loss rebuilt mid-run (configure again, tables from the checkpoint) continues to the bit: the
    schedule is a function of the step, the freeze counter a buffer."""
    n, total = 10, 8
    make = lambda: NUCLRLoss(n, tau=0.1, zeta_lr=0.1, freeze_zeta_epochs=1, zeta_lr_schedule="cosine")  # noqa: E731
    batches = [(_emb(5, seed=40 + t), torch.randperm(n, generator=torch.Generator().manual_seed(t))[:5])
               for t in range(total)]

    def steps(loss, ts):
        for t in ts:
            (img, txt), idx = batches[t]
            loss.on_step(t, total)
            loss(img, txt, index=idx)

    straight, first = make(), make()
    for loss in (straight, first):
        loss.configure(num_samples=n, steps_per_epoch=3, total_steps=total)
    steps(straight, range(total))
    steps(first, range(4))
    save_file({k: v.contiguous() for k, v in first.state_dict().items()}, str(tmp_path / "loss_state.safetensors"))
    resumed = make()
    resumed.configure(num_samples=n, steps_per_epoch=3, total_steps=total)
    resumed.load_state_dict(load_file(str(tmp_path / "loss_state.safetensors")))
    steps(resumed, range(4, total))
    for k, v in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k


def test_hook_options_are_checked_and_a_whole_run_freeze_warns():
    n = 8
    with pytest.raises(MedclrError, match="not both"):
        NUCLRLoss(n, freeze_zeta_epochs=1, freeze_zeta_steps=2)
    with pytest.raises(MedclrError, match="zeta_lr_schedule 'linear': expected one of constant, cosine"):
        NUCLRLoss(n, zeta_lr_schedule="linear")
    with pytest.raises(MedclrError, match="freeze_zeta_epochs: expected a number of epochs >= 0"):
        NUCLRLoss(n, freeze_zeta_epochs=-1)
    loss = NUCLRLoss(n, freeze_zeta_epochs=5)
    img, txt = _emb(4, seed=1)
    with pytest.raises(MedclrError, match="needs the run's steps per epoch"):  # never silently unfrozen
        loss(img, txt, index=torch.arange(4))
    (warning,) = loss.configure(num_samples=n, steps_per_epoch=2, total_steps=10)
    assert loss.freeze_zeta_steps == 10 and "covers the whole run (10 steps)" in warning
    assert loss.configure(num_samples=n, steps_per_epoch=2, total_steps=11) == []
    assert build_loss("infonce").configure(num_samples=n, steps_per_epoch=2, total_steps=11) == []  # the default hooks


def test_fixed_point_of_the_sentence_tied_zeta_objective():
    """bench/nuclr_zeta_fixed_point.py solves Eq. 10 with zeta tied per sentence: at its optimum every sentence's
    copies receive, together, the softmax mass of their count (the first-order condition), and a sentence that
    fits more anchors gets the larger zeta."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "nuclr_zeta_fixed_point", Path(__file__).parents[1] / "bench" / "nuclr_zeta_fixed_point.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    n, tau = 40, 0.1
    sid = rng.integers(0, 6, n)
    s = rng.normal(0, 0.2, (n, n))
    s[:, sid == 2] += 0.3  # sentence 2 fits every anchor better: a popular one
    d = s - np.diag(s)[:, None]
    z = mod.solve_tied_zeta(d, sid, tau)
    logits = (d - z[sid][None, :]) / tau
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    mass = (p / p.sum(axis=1, keepdims=True)).sum(axis=0)
    np.testing.assert_allclose(np.bincount(sid, weights=mass), np.bincount(sid).astype(float), atol=1e-5)
    assert abs(z.mean()) < 1e-12 and int(np.argmax(z)) == 2
