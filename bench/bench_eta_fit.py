"""Benchmark: how far DCL-eta_LM is from InfoNCE with the paper's a, k and with the corpus-fitted a, k.

eta = a * p^k with the paper's a = 0.2, k = 0.35 collapses to ~0 under a small domain LM, and then
DCL-eta_LM is InfoNCE. This measures the loss-level difference on a trained checkpoint: N training
rows (seeded), one sentence each (drawn as a training step draws it), in batches of B; images in the
checkpoint's deterministic view (resize, centre crop: no random crop or intensity augmentation);
similarities as the training loop scores them (head.score on head.image_side, i.e. score_blocks in
one process; for the cosine head that is the cosine of the embeddings). Per pair, the symmetric per-pair loss of
medclr.losses (the rows that build_loss(...) averages; the batch means are checked against the
modules) with eta from the table's PLL: the paper's a, k and the label-free corpus fit
(medclr.lm.eta_fit.fit_eta_corpus on the manifest's training sentences); on a phantom manifest also
the row's true class probability (latent_class_prob, as loss.eta_source=true trains) as a reference,
and each eta's mean |per-pair loss - per-pair loss with eta = rho|.

    python bench/bench_eta_fit.py --manifest M --eta eta.parquet --checkpoint CKPT_DIR [--n 512 --batch 64]

Prints JSON lines {"bench": "eta_fit", "metric": ..., "value": ..., "unit": ..., "eta": paper|corpus|true_rho, ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--eta", required=True, help="eta table with a pll column (medclr lm score)")
    ap.add_argument("--checkpoint", required=True, help="a medclr train output directory")
    ap.add_argument("--n", type=int, default=512, help="training rows (default 512)")
    ap.add_argument("--batch", type=int, default=64, help="pairs per batch, as in training (default 64)")
    ap.add_argument("--tau", type=float, default=0.07)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    from medclr.data.manifest import read_manifest
    from medclr.inference import load_checkpoint
    from medclr.lm.eta import DEFAULT_A, DEFAULT_K, eta_from_pll, read_eta_table
    from medclr.lm.eta_fit import fit_eta_corpus
    from medclr.losses import build_loss
    from medclr.losses.functional import dcl_rows, info_nce_rows

    torch.set_num_threads(args.threads)
    manifest = read_manifest(args.manifest)
    table, meta = read_eta_table(args.eta)
    norm = meta.get("norm", "sum")
    fit = fit_eta_corpus(table, manifest, split="train", norm=norm)
    choices = {"paper": (DEFAULT_A, DEFAULT_K), "corpus": (fit["a"], fit["k"])}
    tab = table.drop_duplicates("sentence_hash").set_index("sentence_hash")

    from medclr.data.text import sentence_hash

    rng = np.random.default_rng(args.seed)
    train = manifest[(manifest["split"] == "train") & (manifest["sentences"].map(len) > 0)]
    rows = train.iloc[np.sort(rng.choice(len(train), size=min(args.n, len(train)), replace=False))]
    sentences = [s[int(rng.integers(len(s)))] for s in rows["sentences"]]
    hashes = [sentence_hash(s) for s in sentences]
    pll, n_scored = tab["pll"].reindex(hashes).to_numpy(), tab["n_scored"].reindex(hashes).to_numpy()
    etas = {name: eta_from_pll(pll, n_scored, a=a, k=k, norm=norm) for name, (a, k) in choices.items()}
    if "latent_class_prob" in rows:  # a phantom: the true rho as a reference (training's loss.eta_source=true)
        etas["true_rho"] = rows["latent_class_prob"].to_numpy(dtype=np.float64)
        choices["true_rho"] = (None, None)  # no a, k: JSON null
    root = Path(manifest.attrs.get("root", "") or "")
    paths = [str(root / p) for p in rows["image_path"]]

    eng = load_checkpoint(args.checkpoint)
    model, head = eng.model, eng.model.head
    losses = {"infonce": build_loss("infonce", tau=args.tau), "dcl_lm": build_loss("dcl_lm", tau=args.tau)}
    per_pair = {name: [] for name in choices}
    batch_means = {name: [] for name in choices}
    dcl_pair = {name: [] for name in choices}
    with torch.inference_mode():
        for start in range(0, len(paths) - args.batch + 1, args.batch):
            sl = slice(start, start + args.batch)
            images = torch.stack([eng.prepare(p)[0] for p in paths[sl]])
            features = model.encode_image(images)
            text = model.encode_text(sentences[sl]).embedding.float()
            s = head.score(head.image_side(features).float(), text)  # score_blocks in one process
            sims = (s, s.T)
            pos = torch.arange(s.shape[0])
            base_rows = 0.5 * (info_nce_rows(sims[0], pos, args.tau) + info_nce_rows(sims[1], pos, args.tau))
            base = float(losses["infonce"](sims=sims))
            assert abs(base - float(base_rows.mean())) < 1e-5, (base, float(base_rows.mean()))
            for name in choices:
                eta = torch.tensor(np.array(etas[name][sl]), dtype=s.dtype)
                rows_dcl = 0.5 * (dcl_rows(sims[0], pos, args.tau, eta) + dcl_rows(sims[1], pos, args.tau, eta))
                value = float(losses["dcl_lm"](sims=sims, eta=eta))
                assert abs(value - float(rows_dcl.mean())) < 1e-5, (value, float(rows_dcl.mean()))
                per_pair[name].append((rows_dcl - base_rows).numpy())
                dcl_pair[name].append(rows_dcl.numpy())
                batch_means[name].append((value, base))
    context = {"checkpoint": str(args.checkpoint), "eta_table": str(args.eta), "pairs": sum(len(d) for d in
               per_pair["paper"]), "batch": args.batch, "tau": args.tau, "seed": args.seed, "head": head.kind}
    for name, (a, k) in choices.items():
        d = np.concatenate(per_pair[name])
        eta = etas[name][: len(d)]
        dcl_mean = float(np.mean([v for v, _ in batch_means[name]]))
        info_mean = float(np.mean([b for _, b in batch_means[name]]))
        for metric, value, unit in (
            ("mean_abs_loss_diff_per_pair", float(np.mean(np.abs(d))), "nat"),
            ("median_abs_loss_diff_per_pair", float(np.median(np.abs(d))), "nat"),
            ("pairs_abs_diff_over_0.01", float(np.mean(np.abs(d) > 0.01)), "fraction"),
            ("batch_loss_dcl_lm", dcl_mean, "nat"),
            ("batch_loss_infonce", info_mean, "nat"),
            ("eta_median", float(np.median(eta)), "eta"),
            ("eta_mean", float(np.mean(eta)), "eta"),
        ) + ((("mean_abs_loss_diff_vs_true_rho_per_pair", float(np.mean(np.abs(
                np.concatenate(dcl_pair[name]) - np.concatenate(dcl_pair["true_rho"])))), "nat"),)
             if "true_rho" in dcl_pair and name != "true_rho" else ()):
            print(json.dumps({"bench": "eta_fit", "metric": metric, "value": value, "unit": unit, "eta": name,
                              "a": a, "k": k, **context}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
