"""Benchmark: how far DCL-eta_LM moves the loss from InfoNCE on a trained checkpoint, per eta choice and anchoring.

DCL-eta_LM matters only where eta changes the per-pair loss. This measures that on a trained checkpoint:
N training rows (seeded; studies drawn uniformly, or with --draw sampler as the eta table's training
sampler draws them), one sentence each (as a training step draws it), in batches
of B; images in the checkpoint's deterministic view (resize, centre crop); similarities as the training
loop scores them (head.score on head.image_side, i.e. score_blocks in one process). Per pair, the
per-pair loss of medclr.losses (the rows build_loss(...) averages; the batch means are checked against
the modules), text-anchored (the paper's Eq. 7) and symmetric (medclr's form before the paper's), with eta
per variant of `medclr lm calibrate` (medclr.lm.calibrate): the table's own (the paper's a, k by default);
from the table's PLL, the paper's a = 0.2, k = 0.35 ("paper") and the sentence power law fitted in linear
space to the rule-key frequency ("sentence_fit"); "rule", medclr's DCL-eta_rule (the isotonic map of
medclr.lm.eta_fit, refitted here as calibrate refits it); the constants 0.05 and 0.1; and on a phantom,
rho_sent of the drawn sentence (how often its ground-truth key occurs among the training pairs,
medclr.phantom.sentence_keys.rho_sent; not DCL's false-negative rate q) as a reference. InfoNCE's batch loss
is reported beside (below ~3.0 at B = 64 the model tells its negatives apart, and eta can matter), and the
batches' "batch_loss_floor" (medclr.phantom.sentence_keys.false_negative_floor: log of how many images of
its batch a drawn sentence is true of). That is the text-anchored InfoNCE loss of a model that can tell apart
only which sentences hold of which images, treating every image the sentence is true of as interchangeable;
it is not a bound: a model that knows each study's latent class can go below it.

    python bench/bench_eta_fit.py --manifest M --eta eta.parquet --checkpoint CKPT_DIR [--n 512 --batch 64]

Prints JSON lines {"bench": "eta_fit", "metric": ..., "value": ..., "unit": ..., "eta": ..., "anchor": ...}.
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
    ap.add_argument("--draw", choices=("uniform", "sampler"), default="uniform",
                    help="studies: uniform (default) or as the eta table's training sampler draws them (its "
                         "study_sampling, e.g. finding-balanced); sentences within a study always as the sampler")
    args = ap.parse_args(argv)

    import pandas as pd
    import torch

    from medclr.data.manifest import read_manifest
    from medclr.inference import load_checkpoint
    from medclr.lm.calibrate import calibrate
    from medclr.lm.eta import DEFAULT_A, DEFAULT_ETA_MAX, DEFAULT_K, eta_from_pll, read_eta_table
    from medclr.lm.eta_fit import eta_of_table
    from medclr.losses import build_loss
    from medclr.losses.functional import dcl_rows, info_nce_rows

    torch.set_num_threads(args.threads)
    manifest = read_manifest(args.manifest)
    table, meta = read_eta_table(args.eta)
    norm = meta.get("norm", "sum")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the fits, as `medclr lm calibrate` reports them
        cal = calibrate(manifest, table, tmp, eta_meta=meta)
    variants = cal["variants"]
    # eta = a * p^k from the table's PLL
    power = {"paper": (DEFAULT_A, DEFAULT_K),
             "sentence_fit": (variants["sentence_fit"]["a"], variants["sentence_fit"]["k"])}
    constants = {"constant 0.05": 0.05, "constant 0.1": 0.1}
    # "table": the table's own eta (a, k as its metadata says; none for a DCL-eta_rule table); "rule": the
    # isotonic map (no a, k); the constants: no a, k (JSON null)
    choices = {"table": (meta.get("a"), meta.get("k")), **power, "rule": (None, None),
               **{name: (None, None) for name in constants}}
    tab = table.drop_duplicates("sentence_hash").set_index("sentence_hash")
    rule_eta = pd.Series(eta_of_table(table, {"source": "meaning", "fit": cal["rule_fit"]}, norm=norm,
                                      eta_max=float(meta.get("eta_max", DEFAULT_ETA_MAX)))[0],
                         index=table["sentence_hash"].to_numpy())
    rule_eta = rule_eta[~rule_eta.index.duplicated()]

    from medclr.data.text import sentence_hash

    rng = np.random.default_rng(args.seed)
    train = manifest[(manifest["split"] == "train") & (manifest["sentences"].map(len) > 0)]
    # the sampling the eta table was calibrated for (its fit's record; uniform for older tables): sentences are
    # drawn and rho_sent counted as that training draws them
    from medclr.data.pairs import pair_probabilities
    from medclr.lm.eta_fit import SAMPLING_DEFAULTS

    sampling = {**SAMPLING_DEFAULTS, **(meta.get("eta_params", {}).get("fit", {}).get("sampling") or {})}
    if args.draw == "sampler":  # studies as that training draws them (e.g. finding-balanced), with replacement
        study_p = np.array([p.sum() for p in pair_probabilities([list(x) for x in train["sentences"]], **sampling)])
        rows = train.iloc[rng.choice(len(train), size=args.n, replace=True, p=study_p / study_p.sum())]
    else:
        rows = train.iloc[np.sort(rng.choice(len(train), size=min(args.n, len(train)), replace=False))]
    within = pair_probabilities([list(x) for x in rows["sentences"]], **sampling)
    sentences = [s[int(rng.choice(len(s), p=w / w.sum()))] for s, w in zip(rows["sentences"], within)]
    hashes = [sentence_hash(s) for s in sentences]
    pll, n_scored = tab["pll"].reindex(hashes).to_numpy(), tab["n_scored"].reindex(hashes).to_numpy()
    etas = {name: eta_from_pll(pll, n_scored, a=a, k=k, norm=norm) for name, (a, k) in power.items()}
    etas["table"] = tab["eta"].reindex(hashes).to_numpy(dtype=np.float64)
    etas["rule"] = rule_eta.reindex(hashes).to_numpy(dtype=np.float64)
    etas.update({name: np.full(len(hashes), c) for name, c in constants.items()})
    from medclr.phantom.sentence_keys import false_negative_floor, rho_sent, sentence_key

    keys = [[sentence_key(x) for x in row] for row in train["sentences"]]
    rho_rows = rho_sent([list(x) for x in train["sentences"]], **sampling)
    rho = {k: float(v) for ks, vs in zip(keys, rho_rows) for k, v in zip(ks, vs)}
    # rho_sent: the key's share of the pairs (a reference; not DCL's false-negative rate q of loss.eta_source=true)
    etas["rho_sent"] = np.array([rho[sentence_key(x)] for x in sentences])
    # the InfoNCE loss of a model that tells apart only which sentences hold of which images (every image of the
    # batch a sentence is true of alike); not a bound: a model that knows the studies' latent classes goes below
    report_keys = [frozenset(sentence_key(x) for x in row) for row in rows["sentences"]]
    drawn_keys = [sentence_key(x) for x in sentences]
    floor = np.concatenate([false_negative_floor(drawn_keys[b:b + args.batch], list(rows["latent_class"].iloc[b:b + args.batch]),
                                                 report_keys[b:b + args.batch])
                            for b in range(0, len(rows) - args.batch + 1, args.batch)])
    choices["rho_sent"] = (None, None)  # no a, k: JSON null
    root = Path(manifest.attrs.get("root", "") or "")
    paths = [str(root / p) for p in rows["image_path"]]

    eng = load_checkpoint(args.checkpoint)
    model, head = eng.model, eng.model.head
    anchors = ("text", "symmetric")
    per_pair = {(name, an): [] for name in choices for an in anchors}
    batch_means = {(name, an): [] for name in choices for an in anchors}
    with torch.inference_mode():
        for start in range(0, len(paths) - args.batch + 1, args.batch):
            sl = slice(start, start + args.batch)
            images = torch.stack([eng.prepare(p)[0] for p in paths[sl]])
            features = model.encode_image(images)
            text = model.encode_text(sentences[sl]).embedding.float()
            s = head.score(head.image_side(features).float(), text)  # score_blocks in one process
            sims = (s, s.T)
            pos = torch.arange(s.shape[0])
            for an in anchors:
                parts = (sims[1],) if an == "text" else sims  # text anchors: rows of s_t2i
                base_rows = sum(info_nce_rows(x, pos, args.tau) for x in parts) / len(parts)
                base = float(build_loss("infonce", tau=args.tau, anchor=an)(sims=sims))
                assert abs(base - float(base_rows.mean())) < 1e-5, (base, float(base_rows.mean()))
                for name in choices:
                    eta = torch.tensor(np.array(etas[name][sl]), dtype=s.dtype)
                    rows_dcl = sum(dcl_rows(x, pos, args.tau, eta) for x in parts) / len(parts)
                    value = float(build_loss("dcl_lm", tau=args.tau, anchor=an)(sims=sims, eta=eta))
                    assert abs(value - float(rows_dcl.mean())) < 1e-5, (value, float(rows_dcl.mean()))
                    per_pair[name, an].append((rows_dcl - base_rows).numpy())
                    batch_means[name, an].append((value, base))
    context = {"checkpoint": str(args.checkpoint), "eta_table": str(args.eta),
               "pairs": sum(len(d) for d in per_pair["paper", "text"]), "batch": args.batch, "tau": args.tau,
               "seed": args.seed, "head": head.kind, "draw": args.draw}
    print(json.dumps({"bench": "eta_fit", "metric": "batch_loss_floor", "value": float(floor.mean()), "unit": "nat",
                      "eta": None, "anchor": "text", "a": None, "k": None,
                      "description": "text-anchored InfoNCE loss of a model that can tell apart only which sentences "
                                     "hold of which images (every image of the batch a sentence is true of alike: "
                                     "log of how many); not a bound, a model that knows each study's latent class "
                                     "goes below it", **context}))
    for (name, an), diffs in per_pair.items():
        a, k = choices[name]
        d = np.concatenate(diffs)
        eta = etas[name][: len(d)]
        for metric, value, unit in (
            ("mean_abs_loss_diff_per_pair", float(np.mean(np.abs(d))), "nat"),
            ("median_abs_loss_diff_per_pair", float(np.median(np.abs(d))), "nat"),
            ("pairs_abs_diff_over_0.01", float(np.mean(np.abs(d) > 0.01)), "fraction"),
            ("batch_loss_dcl_lm", float(np.mean([v for v, _ in batch_means[name, an]])), "nat"),
            ("batch_loss_infonce", float(np.mean([b for _, b in batch_means[name, an]])), "nat"),
            ("eta_median", float(np.median(eta)), "eta"),
            ("eta_mean", float(np.mean(eta)), "eta"),
        ):
            print(json.dumps({"bench": "eta_fit", "metric": metric, "value": value, "unit": unit, "eta": name,
                              "anchor": an, "a": a, "k": k, **context}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
