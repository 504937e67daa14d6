"""Two CPU processes (gloo): every loss, local anchors x gathered candidates, must give the
single-process full-batch gradient after DDP-style averaging, and identical per-sample tables;
both on embeddings (the cosine head) and on the LSE+NL head's similarity blocks (score_blocks
gathers the NL-contextualised region cells and sentences), where the head's own parameters are
checked too."""

import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from medclr.losses import build_loss
from medclr.losses.distributed import score_blocks
from medclr.models.image import ImageFeatures
from medclr.models.similarity import LSENLHead

N_SAMPLES, B, D_IN, D, GRID = 10, 8, 6, 6, 2
STEPS = 3
# (case id, loss name, constructor kwargs, rows held by rank 0 / rank 1)
CASES = [
    ("infonce", "infonce", {"tau": 0.2}, (4, 4)),
    ("infonce_uneven", "infonce", {"tau": 0.2}, (3, 5)),
    ("siglip", "siglip", {"scale_init": 4.0, "bias_init": -1.0}, (4, 4)),
    ("infonce_text", "infonce", {"tau": 0.2, "anchor": "text"}, (3, 5)),
    ("dcl", "dcl", {"tau": 0.3, "eta": 0.1}, (4, 4)),
    ("dcl_lm", "dcl_lm", {"tau": 0.3, "anchor": "text"}, (4, 4)),
    ("dcl_lm_text_uneven", "dcl_lm", {"tau": 0.3, "anchor": "text"}, (3, 5)),
    ("dcl_lm_symmetric", "dcl_lm", {"tau": 0.3, "anchor": "symmetric"}, (4, 4)),
    ("sogclr", "sogclr", {"num_samples": N_SAMPLES, "tau": 0.2, "gamma": 0.7}, (4, 4)),
    ("nuclr", "nuclr", {"num_samples": N_SAMPLES, "tau": 0.2, "gamma": 0.7, "zeta_lr": 0.05}, (4, 4)),
    ("nuclr_uneven", "nuclr", {"num_samples": N_SAMPLES, "tau": 0.2, "gamma": 0.7, "zeta_lr": 0.05}, (5, 3)),
    ("decl", "decl", {"num_samples": N_SAMPLES, "tau": 0.3, "lambda0": 0.7, "lambda_decay_steps": 2.0}, (4, 4)),
    ("t_infonce", "t_infonce", {"tau": 0.8}, (4, 4)),
    ("t_infonce_uneven", "t_infonce", {"tau": 0.8}, (3, 5)),
    ("t_infonce_anchor", "t_infonce", {"tau": 0.8, "normalization": "anchor"}, (4, 4)),
]


def _data(step):
    g = torch.Generator().manual_seed(100 + step)
    x_img = torch.randn(B, D_IN, generator=g, dtype=torch.float64)
    x_txt = x_img + 0.5 * torch.randn(B, D_IN, generator=g, dtype=torch.float64)
    # duplicates inside the global batch and across ranks (as DistributedSampler padding makes)
    idx = [torch.tensor([0, 1, 2, 3, 4, 5, 2, 6]), torch.tensor([7, 3, 9, 8, 3, 1, 0, 5]),
           torch.tensor([4, 4, 6, 9, 2, 8, 7, 1])][step]
    eta = torch.linspace(0.0, 0.3, B, dtype=torch.float64)
    weight = torch.linspace(0.5, 2.0, B, dtype=torch.float64)
    return x_img, x_txt, idx, eta, weight


def _head():
    """An LSE+NL head whose non-local block is not the identity (its output layer is zero at init)."""
    head = LSENLHead(D, gamma=4.0, learn_gamma=True).double()
    with torch.no_grad():
        head.nl.out.weight.copy_(0.3 * torch.randn(D, D // 2, generator=torch.Generator().manual_seed(5),
                                                   dtype=torch.float64))
    return head


def _regions(x_img, w_img):
    """Per-pair inputs -> a B x D x GRID x GRID region map (each cell its own mix of the input)."""
    g = torch.Generator().manual_seed(11)
    cell_mix = torch.randn(GRID * GRID, D_IN, D_IN, generator=g, dtype=torch.float64)
    cells = torch.einsum("bi,cij,jd->bdc", x_img, cell_mix, w_img)
    return cells.reshape(x_img.shape[0], D, GRID, GRID)


def _run(rank, world, sizes, name, kw, head=False):
    """Train-mode steps on a shared linear 'encoder'; returns per-step (value, grads) and tables."""
    torch.manual_seed(0)
    w_img = torch.randn(D_IN, D, dtype=torch.float64)
    w_txt = torch.randn(D_IN, D, dtype=torch.float64)
    loss = build_loss(name, **kw).double()
    lse = _head() if head else None
    lo = sum(sizes[:rank])
    sl = slice(lo, lo + sizes[rank]) if world > 1 else slice(0, B)
    steps = []
    for step in range(STEPS):
        x_img, x_txt, idx, eta, weight = _data(step)
        params = [w_img.clone().requires_grad_(True), w_txt.clone().requires_grad_(True)]
        extra = {"weight": weight[sl]} if name == "t_infonce" else {}
        txt = x_txt[sl] @ params[1]
        if lse is None:
            out = loss(x_img[sl] @ params[0], txt, index=idx[sl], eta=eta[sl], **extra)
        else:
            regions = _regions(x_img[sl], params[0])
            side = lse.image_side(ImageFeatures(regions, regions.mean(dim=(2, 3))))
            out = loss(sims=score_blocks(lse.score, side, txt), index=idx[sl], eta=eta[sl], **extra)
            params = params + list(lse.parameters())
        grads = list(torch.autograd.grad(out, params + list(loss.parameters())))
        value = out.detach().clone()
        if world > 1:  # what DDP does: average gradients (and we average the logged value)
            for t in grads + [value]:
                dist.all_reduce(t)
                t /= world
        steps.append((value, grads))
    return steps, {k: v.clone() for k, v in loss.state_dict().items()}


def _worker(rank, world, port, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    try:
        results = {(cid, head): _run(rank, world, sizes, name, kw, head) for cid, name, kw, sizes in CASES
                   for head in (False, True)}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    ctx = mp.spawn(_worker, args=(2, _free_port(), str(out)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            pytest.fail("2-process gloo run did not finish in 120 s")
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


@pytest.mark.parametrize("head", [False, True], ids=["embeddings", "lse_nl"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_match_single_process(two_rank_results, case, head):
    cid, name, kw, sizes = case
    ref_steps, ref_tables = _run(0, 1, sizes, name, kw, head)
    for rank in range(2):
        steps, tables = two_rank_results[rank][(cid, head)]
        for step, ((v, grads), (rv, rgrads)) in enumerate(zip(steps, ref_steps)):
            torch.testing.assert_close(v, rv, rtol=1e-9, atol=1e-12, msg=f"{cid} value, step {step}")
            for g, rg in zip(grads, rgrads):
                torch.testing.assert_close(g, rg, rtol=1e-8, atol=1e-11, msg=f"{cid} grad, step {step}")
        # tables: identical on both ranks, and equal to the single-process run
        for k, t in tables.items():
            assert torch.equal(t, two_rank_results[0][(cid, head)][1][k]), (cid, k)
            torch.testing.assert_close(t, ref_tables[k], rtol=1e-6, atol=1e-7, msg=f"{cid} table {k}")
    if "num_samples" in kw:
        assert int(ref_tables["step"]) == STEPS
