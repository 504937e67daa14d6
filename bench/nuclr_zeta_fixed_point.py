"""Diagnostic: what NUCLR's text popularity zeta converges to for a trained model, and how well that can track
the true frequency of a sentence (issue 29: "Spearman of zeta with rho_sent >= 0.5").

NUCLR learns zeta by stochastic steps on Phi_t (Eq. 10 of the arXiv version) while the model moves. This
freezes a checkpoint's model and solves Eq. 10 to its optimum on N training pairs drawn as the run's sampler
draws them (study weights and sentence draws of its train_config.yaml): with d_ij = s_ij - s_ii and zeta tied
per distinct sentence (loss.zeta_key: sentence), minimise

    Phi(z) = 1/N sum_i tau log sum_j exp((d_ij - z_{sid(j)}) / tau) + 1/N sum_j z_{sid(j)}

(convex; scipy L-BFGS, float64). The optimum is the best any step rule can reach for that model, so its
Spearman with log rho_sent bounds what training's zeta can show at that model's quality; the run's own zeta is
reported beside it. Similarities are the checkpoint's head scores (head.score on head.image_side), images in
its deterministic view.

    python bench/nuclr_zeta_fixed_point.py --checkpoint RUN_DIR [--n 1536] [--seed 0]

Prints JSON lines {"bench": "nuclr_zeta_fixed_point", "metric": ..., "value": ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def solve_tied_zeta(d: np.ndarray, sid: np.ndarray, tau: float) -> np.ndarray:
    """argmin of Phi over z (one value per sentence id in ``sid``), shifted to mean 0 (Phi is shift-invariant)."""
    from scipy.optimize import minimize
    from scipy.special import logsumexp, softmax

    n, k = d.shape[0], int(sid.max()) + 1
    count = np.bincount(sid, minlength=k).astype(np.float64)

    def phi(z: np.ndarray) -> tuple[float, np.ndarray]:
        logits = (d - z[sid][None, :]) / tau
        value = tau * logsumexp(logits, axis=1).mean() + (count @ z) / n
        mass = softmax(logits, axis=1).sum(axis=0)  # M_j: the mass candidate j receives from all anchors
        return float(value), (count - np.bincount(sid, weights=mass, minlength=k)) / n

    res = minimize(phi, np.zeros(k), jac=True, method="L-BFGS-B", options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12})
    return res.x - res.x.mean()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a NUCLR `medclr train` output directory")
    ap.add_argument("--n", type=int, default=1536, help="training pairs drawn (default 1536)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64, help="images encoded at a time")
    args = ap.parse_args(argv)

    import torch
    import yaml
    from safetensors.numpy import load_file
    from scipy.stats import spearmanr

    from medclr.data.pairs import pair_probabilities
    from medclr.data.text import sentence_hash
    from medclr.inference import load_checkpoint
    from medclr.inference.checkpoint import TEXT_HASH_KEY, hash_to_int
    from medclr.phantom.sentence_keys import rho_sent
    from medclr.training.data import load_table

    run = Path(args.checkpoint)
    cfg = yaml.safe_load((run / "train_config.yaml").read_text())
    cfg["data"]["cache"] = "none"
    table = load_table(cfg, eta=False)
    d = cfg["data"]
    sampling = dict(sentence_sampling=d["sentence_sampling"], other_weight=float(d["other_sentence_weight"]),
                    study_sampling=d["study_sampling"], study_balance=float(d["study_balance"]))
    pairs = pair_probabilities(table.sentences, **sampling)
    rho = rho_sent(table.sentences, **sampling)
    flat = [(i, j) for i, p in enumerate(pairs) for j in range(len(p))]
    prob = np.concatenate(pairs)
    rng = np.random.default_rng(args.seed)
    pick = rng.choice(len(flat), size=args.n, replace=True, p=prob / prob.sum())
    rows = [flat[k] for k in pick]
    texts = [table.sentences[i][j] for i, j in rows]
    sid_of = {t: s for s, t in enumerate(dict.fromkeys(texts))}
    sid = np.array([sid_of[t] for t in texts])
    log_rho = np.zeros(len(sid_of))
    for (i, j), t in zip(rows, texts):
        log_rho[sid_of[t]] = np.log(rho[i][j])

    eng = load_checkpoint(run)
    head = eng.model.head
    torch.set_num_threads(2)
    with torch.inference_mode():
        sides = []
        for b in range(0, args.n, args.batch):
            imgs = torch.stack([eng.prepare(table.paths[i])[0] for i, _ in rows[b:b + args.batch]])
            sides.append(head.image_side(eng.model.encode_image(imgs)).float())
        side = torch.cat(sides)
        txt = torch.cat([eng.model.encode_text(texts[b:b + 256]).embedding.float() for b in range(0, args.n, 256)])
        s = head.score(side, txt).double().numpy()  # images x texts
    tau = float(cfg["loss"].get("tau", 0.01))
    z = solve_tied_zeta(s - np.diag(s)[:, None], sid, tau)
    drawn = np.bincount(sid, minlength=len(sid_of))
    out = {"spearman_fixed_point_vs_log_rho": float(spearmanr(z, log_rho)[0]),
           "spearman_fixed_point_vs_draws": float(spearmanr(z, drawn)[0]),
           "sd_fixed_point_zeta": float(np.std(z)),
           "distinct_sentences": len(sid_of), "pairs": args.n, "tau": tau,
           "mean_positive_rank": float(np.mean((s > np.diag(s)[:, None]).sum(axis=1)))}
    state = load_file(str(run / "loss_state.safetensors"))
    if TEXT_HASH_KEY in state and "zeta_txt" in state:
        pos = {int(h): k for k, h in enumerate(state[TEXT_HASH_KEY])}
        trained = np.array([state["zeta_txt"][pos[hash_to_int(sentence_hash(t))]] for t in sid_of], np.float64)
        out.update(spearman_trained_vs_log_rho=float(spearmanr(trained, log_rho)[0]),
                   spearman_trained_vs_fixed_point=float(spearmanr(trained, z)[0]),
                   sd_trained_zeta=float(np.std(trained)))
    for metric, value in out.items():
        print(json.dumps({"bench": "nuclr_zeta_fixed_point", "metric": metric, "value": value,
                          "checkpoint": str(run), "seed": args.seed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
