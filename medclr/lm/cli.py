"""`medclr lm fit | score | calibrate | report`: a domain masked LM, sentence PLL -> eta, eta's calibration."""

from __future__ import annotations

import argparse
import json
import logging

from medclr.errors import MedclrError
from medclr.lm.eta import DEFAULT_ETA_MAX
from medclr.lm.pll import MAX_PIECES

HELP = "fit a domain masked LM, score sentences (PLL -> eta), calibrate eta"  # what `medclr --help` shows

log = logging.getLogger(__name__)

_FIT_EPILOG = """\
examples:
  medclr prepare --openi --out openi.parquet
  medclr lm fit --manifest openi.parquet --out runs/lm    # about 3-5 min on 2 idle cores; --max-minutes caps it
  medclr lm fit --manifest m.parquet --out runs/lm --layers 2 --hidden 128 --max-minutes 2
  medclr lm fit --manifest openi.parquet --out runs/lm --device cpu    # the CPU's LM on a GPU machine

The directory holds a Hugging Face BertForMaskedLM + tokenizer (save_pretrained):
`medclr lm score --model runs/lm` scores with it, and the text encoder can start
from it (AutoModel.from_pretrained). medclr_lm.json records the recipe and losses.
"""

_SCORE_EPILOG = """\
examples:
  medclr lm score --manifest openi.parquet --model runs/lm --out runs/eta.parquet
  medclr lm score --manifest m.parquet --model /models/CXR-BERT --trust-remote-code --out eta.parquet
  medclr lm score --manifest m.parquet --model runs/lm --out eta.parquet --a 0.1 --k 0.5  # cached: eta only
  medclr lm score --manifest m.parquet --model runs/lm --out eta_rule.parquet --eta-fit meaning  # DCL-eta_rule
  medclr lm score --manifest m.parquet --model runs/lm --out eta_balanced.parquet \
      --study-sampling findings --study-balance 1  # eta for a run that draws rare findings more often

eta is the paper's estimator by default: eta = min(a * p^k, eta_max) with log p = the
sentence's pseudo-log-likelihood (--norm sum; --norm mean: PLL per word piece), a = 0.2,
k = 0.35 (--eta-fit paper), or your own --a/--k. Those a, k were grid-searched for
CXR-BERT's PLL scale; on a small domain LM they give a small eta (a mean of ~0.01 on the
demo's). --eta-fit meaning is medclr's own method, DCL-eta_rule, not the paper's: eta
from the frequency of the sentence's rule-read meaning key (polarity, finding, side;
normal statements pooled), an isotonic map of the LM's probability of that meaning.
The table also holds the short forms training may show in a sentence's place
("Pneumothorax."), so a step's eta is that of the sentence it shows. The table's
metadata records what eta is (eta_params: a and k, or the map's knots).
One row per distinct sentence: sentence_hash, sentence, count, n_tokens,
n_scored, pll, pll_per_token, eta. Running again scores only
sentences not yet in --out (same model; --rescore scores all again); a file at --out
that is not such a table is refused unless --overwrite. medclr.lm.eta.join_eta aligns
eta with the manifest's sentences for training.
"""

_CAL_EPILOG = """\
examples:
  medclr phantom --out phantom/ --n 1500
  medclr prepare --mimic phantom/ --views all --out phantom.parquet
  medclr lm score --manifest phantom.parquet --model runs/lm --out phantom_eta.parquet
  medclr lm calibrate --manifest phantom.parquet --eta phantom_eta.parquet \\
      --ground-truth phantom/phantom_ground_truth.parquet --out runs/calibration

Reports every eta variant, as measured (none is fitted to these), against two
ground-truth quantities per training (report, sentence) pair, drawn as training
draws them:
  q         DCL's false-negative rate of the sentence (the DCL-eta_True oracle):
            the probability that a negative image, drawn as training draws the
            studies, is one the sentence is true of (read from each study's
            latent_class and its report's sentence keys); raw, so it can exceed
            eta_max ("No cardiomegaly." is true of most images);
  rho_sent  how often the sentence's ground-truth key (polarity, finding, side,
            or "normal", read by the phantom's own rules) occurs among the pairs.
Variants: table (the table's own eta), paper (a = 0.2, k = 0.35), rule
(DCL-eta_rule, medclr's meaning fit), sentence_fit (a * p^k fitted to the rule
key's frequency), constant 0.05 and 0.1. Per variant and quantity y:
E[eta]/E[y], Spearman, the median |log eta/y| and E|1/(1-eta) - 1/(1-y)|.
Writes calibration.json, calibration.png (the reliability plot: mean q, left,
and mean rho_sent, right, against mean eta in 10 bins) and per_key.csv. The
manifest needs latent_class (a phantom manifest has it); --ground-truth joins
it and the study prior latent_class_prob for a study-level Spearman.
"""

_REPORT_EPILOG = """\
example:
  medclr lm report --eta runs/eta.parquet --out runs/lm_report
"""


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lm_command", metavar="{fit,score,calibrate,report}")
    parser.set_defaults(run=lambda _a: (parser.print_help(), 2)[1])
    fmt = argparse.RawDescriptionHelpFormatter

    from medclr.lm.eta_fit import METHODS
    from medclr.lm.fit import FitConfig

    d = FitConfig()
    p = sub.add_parser("fit", help="train a WordPiece tokenizer + small BERT masked LM on the training sentences",
                       description="Train a WordPiece tokenizer and a small BERT masked LM on the sentences of "
                       "the manifest's training split, sized for a CPU (minutes).", epilog=_FIT_EPILOG,
                       formatter_class=fmt)
    p.add_argument("--manifest", required=True, help="manifest parquet with a 'sentences' column")
    p.add_argument("--out", required=True, help="output directory (Hugging Face format)")
    p.add_argument("--split", default="train", help="rows to train on: a split name or 'all' (default: train); "
                   "the 'validate' rows give a validation loss")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size,
                   help=f"WordPiece vocabulary at most (default {d.vocab_size})")
    p.add_argument("--min-frequency", type=int, default=d.min_frequency, help=f"default {d.min_frequency}")
    p.add_argument("--layers", type=int, default=d.layers, help=f"default {d.layers}")
    p.add_argument("--hidden", type=int, default=d.hidden, help=f"default {d.hidden}")
    p.add_argument("--heads", type=int, default=d.heads, help=f"default {d.heads}")
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help=f"positions, special tokens included (default {d.max_length})")
    p.add_argument("--epochs", type=float, default=d.epochs, help=f"passes over the sentences (default {d.epochs:g})")
    p.add_argument("--max-minutes", type=float, default=d.max_minutes,
                   help="optional wall-clock cap on top of --epochs; the LR schedule is fitted to it (default: none, "
                        "so the same command gives the same LM on any machine)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"default {d.batch_size}")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr:g})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"default {d.seed}")
    p.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1 ... (default: cuda when present; the same seed gives the same LM on "
                        "every CPU, a GPU's differs in the last bits)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (default: torch's; 1 is faster on a busy shared machine)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars, transformers' included (default: bars when stderr is a terminal)")
    p.set_defaults(run=run_fit)

    p = sub.add_parser("score", help="PLL of every distinct manifest sentence -> eta table (cached)",
                       description="Score each distinct sentence of a manifest with a masked LM "
                       "(pseudo-log-likelihood) and turn it into eta_LM = min(a * p^k, eta_max).",
                       epilog=_SCORE_EPILOG, formatter_class=fmt)
    p.add_argument("--manifest", required=True, help="manifest parquet with a 'sentences' column")
    p.add_argument("--model", required=True, metavar="DIR_OR_HUB_ID",
                   help="a masked LM: a local directory (e.g. from `medclr lm fit`) or a hub id already in the cache")
    p.add_argument("--out", required=True, help="eta table parquet (also the cache)")
    p.add_argument("--split", default="all", help="rows to score: a split name or 'all' (default)")
    p.add_argument("--eta-fit", choices=METHODS, default="paper",
                   help="what eta is when --a/--k are not given: paper (default) = the paper's a = 0.2, k = 0.35; "
                   "meaning = medclr's DCL-eta_rule (the frequency of the sentence's rule-read meaning among the "
                   "training pairs, mapped from the LM's probability of that meaning); sentence = a * p^k fitted to "
                   "that same rule-key frequency")
    p.add_argument("--eta-fit-split", default="train",
                   help="rows whose pairs the fit uses: a split name or 'all' (default train)")
    g = p.add_argument_group("how training draws pairs (the fit's weights; give the values of the training "
                             "config's data.* keys of the same names when it does not draw uniformly)")
    g.add_argument("--sentence-sampling", choices=("uniform", "findings"), default="uniform",
                   help="data.sentence_sampling: which sentence of a report a step draws (default uniform)")
    g.add_argument("--other-sentence-weight", type=float, default=0.1,
                   help="data.other_sentence_weight: the weight of a sentence stating no finding under findings "
                        "(default 0.1)")
    g.add_argument("--study-sampling", choices=("uniform", "findings"), default="uniform",
                   help="data.study_sampling: which reports a batch holds (default uniform)")
    g.add_argument("--study-balance", type=float, default=0.5,
                   help="data.study_balance: 0 = uniform, 1 = every finding group drawn equally often (default 0.5)")
    p.add_argument("--a", "--eta-a", dest="a", type=float, default=None,
                   help="eta scale a; with --k, overrides --eta-fit (paper: 0.2)")
    p.add_argument("--k", "--eta-k", dest="k", type=float, default=None,
                   help="eta exponent k; with --a, overrides --eta-fit (paper: 0.35)")
    p.add_argument("--norm", choices=("sum", "mean"), default="sum",
                   help="log p = PLL summed over word pieces (sum, paper) or per piece (mean)")
    p.add_argument("--eta-max", type=float, default=DEFAULT_ETA_MAX,
                   help=f"clip eta at this value < 1 (default {DEFAULT_ETA_MAX})")
    p.add_argument("--pll", choices=("original", "word-l2r"), default="original",
                   help="PLL variant: original (Salazar et al.) or word-l2r (Kauf & Ivanova)")
    p.add_argument("--long", choices=("window", "truncate", "error"), default="window",
                   help="sentences over the model's length limit: score every piece in a centred window "
                   "(default), score only the first pieces, or stop")
    p.add_argument("--batch-size", type=int, default=64, help="sentences expanded together (default 64)")
    p.add_argument("--max-batch-tokens", type=int, default=32768, help="padded tokens per forward pass (memory)")
    p.add_argument("--max-pieces", type=int, default=MAX_PIECES,
                   help=f"word pieces scored per sentence at most (default {MAX_PIECES}; a longer one, e.g. a "
                        "pasted document, is scored on its first pieces and counted in the log)")
    p.add_argument("--save-every", type=float, default=120.0, metavar="SECONDS",
                   help="rewrite --out after this much scoring (default 120): a killed run resumes from it")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when present)")
    p.add_argument("--rescore", action="store_true",
                   help="ignore the cached PLLs of the eta table in --out: score every sentence again")
    p.add_argument("--overwrite", action="store_true",
                   help="replace whatever file --out holds (without it, a file there that is not an eta table of "
                        "`medclr lm score` is refused; an eta table there is resumed, or with --rescore replaced)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    p.add_argument("--allow-network", action="store_true", help="let transformers download a hub model")
    p.add_argument("--trust-remote-code", action="store_true", help="run the model repository's own code")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars, transformers' included (default: bars when stderr is a terminal)")
    p.set_defaults(run=run_score)

    p = sub.add_parser("calibrate", help="every eta variant against q (DCL's false-negative rate) and rho_sent "
                       "(phantom)",
                       description="Compare every eta variant, as measured, with q, DCL's false-negative rate of each "
                       "sentence (the DCL-eta_True oracle), and with rho_sent, the frequency of its ground-truth key "
                       "among the training pairs (CXR-Phantom): scale, ranking, log error, reliability plot.",
                       epilog=_CAL_EPILOG,
                       formatter_class=fmt)
    p.add_argument("--manifest", required=True,
                   help="manifest with a sentences column (a CXR-Phantom manifest: its sentences carry the ground-truth keys)")
    p.add_argument("--ground-truth", default=None, metavar="PARQUET",
                   help="take latent_class (which q needs) and the study prior latent_class_prob from this table "
                   "(e.g. phantom/phantom_ground_truth.parquet), joined on dicom_id, else study_id")
    p.add_argument("--eta", required=True, help="eta table from `medclr lm score`")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--norm", choices=("sum", "mean"), default=None, help="default: the eta table's")
    p.add_argument("--fit-split", default="train",
                   help="the rows whose pairs and studies define q, rho_sent and the fits (default train)")
    g = p.add_argument_group("how training draws pairs, for q and rho_sent (default: what the eta table was "
                             "calibrated for; any of these flags: the training config's data.* keys of the same "
                             "names, the others at their defaults)")
    g.add_argument("--sentence-sampling", choices=("uniform", "findings"), default=None,
                   help="data.sentence_sampling: which sentence of a report a step draws (default the eta table's)")
    g.add_argument("--other-sentence-weight", type=float, default=None,
                   help="data.other_sentence_weight: the weight of a sentence stating no finding under findings "
                        "(default the eta table's)")
    g.add_argument("--study-sampling", choices=("uniform", "findings"), default=None,
                   help="data.study_sampling: which reports a batch holds (default the eta table's)")
    g.add_argument("--study-balance", type=float, default=None,
                   help="data.study_balance: 0 = uniform, 1 = every finding group drawn equally often (default the eta table's)")
    p.set_defaults(run=run_calibrate)

    p = sub.add_parser("report", help="PLL distribution and PLL against sentence frequency (plot + json)",
                       description="Describe an eta table: the PLL distribution, PLL against how often each "
                       "sentence occurs, the top and bottom sentences.", epilog=_REPORT_EPILOG, formatter_class=fmt)
    p.add_argument("--eta", required=True, help="eta table from `medclr lm score`")
    p.add_argument("--out", required=True, help="output directory (lm_pll_distribution.png, lm_report.json)")
    p.set_defaults(run=run_report)


def _sentences(manifest, split):
    from medclr.lm.eta import manifest_sentences

    return manifest_sentences(manifest, split)["sentence"].tolist()


def _threads(n):
    if n is not None:
        if n < 1:
            raise MedclrError("--threads must be at least 1")
        import torch

        torch.set_num_threads(n)


def run_fit(args: argparse.Namespace) -> int:
    from medclr.data.manifest import read_manifest
    from medclr.lm.fit import FitConfig, fit_lm

    _threads(args.threads)
    manifest = read_manifest(args.manifest)
    train = _sentences(manifest, args.split)
    val = _sentences(manifest, "validate") if args.split != "all" and (manifest["split"] == "validate").any() else []
    cfg = FitConfig(vocab_size=args.vocab_size, min_frequency=args.min_frequency, layers=args.layers,
                    hidden=args.hidden, heads=args.heads, max_length=args.max_length, epochs=args.epochs,
                    max_minutes=args.max_minutes, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                    device=args.device)
    from medclr.data.quality import data_quality, summary_line, write_quality

    rows = manifest if args.split == "all" else manifest[manifest["split"] == args.split]
    quality = data_quality(rows)
    log.info("%s", summary_line(quality))
    fit_lm(train, args.out, cfg, val_sentences=val, overwrite=args.overwrite, progress=_progress(args))
    write_quality(quality, args.out)  # beside the model it describes
    return 0


def run_score(args: argparse.Namespace) -> int:
    from medclr.data.manifest import read_manifest
    from medclr.lm.load import load_masked_lm
    from medclr.lm.score import check_out, score_manifest

    if args.batch_size < 1 or args.max_batch_tokens < 1 or args.max_pieces < 1:
        raise MedclrError("--batch-size and --max-batch-tokens must be positive")
    check_out(args.out, args.overwrite)  # before the model loads
    _threads(args.threads)
    manifest = read_manifest(args.manifest)
    model, tok = load_masked_lm(args.model, allow_network=args.allow_network,
                                trust_remote_code=args.trust_remote_code, device=args.device)
    summary = score_manifest(manifest, model, tok, args.out, model_name=str(args.model),
                             split=None if args.split == "all" else args.split, a=args.a, k=args.k,
                             eta_fit=args.eta_fit, fit_split=args.eta_fit_split, norm=args.norm,
                             sampling={"sentence_sampling": args.sentence_sampling,
                                       "other_weight": args.other_sentence_weight,
                                       "study_sampling": args.study_sampling, "study_balance": args.study_balance},
                             eta_max=args.eta_max, word_l2r=args.pll == "word-l2r", long=args.long,
                             batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens,
                             max_pieces=args.max_pieces, save_every_s=args.save_every, progress=_progress(args),
                             rescore=args.rescore, overwrite=args.overwrite)
    log.info("next: medclr train --config dcl_lm data.manifest=%s data.eta=%s out=RUN (docs/training.md)",
             args.manifest, args.out)
    print(json.dumps(summary))
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from medclr.data.manifest import read_manifest
    from medclr.lm.calibrate import calibrate
    from medclr.lm.eta import read_eta_table

    manifest = read_manifest(args.manifest)
    if args.ground_truth:
        from medclr.data.groundtruth import attach_ground_truth
        from medclr.lm.calibrate import GROUND_TRUTH_JOIN

        manifest = attach_ground_truth(manifest, args.ground_truth, **GROUND_TRUTH_JOIN)
    table, meta = read_eta_table(args.eta)
    given = {"sentence_sampling": args.sentence_sampling, "other_weight": args.other_sentence_weight,
             "study_sampling": args.study_sampling, "study_balance": args.study_balance}
    sampling = {k: v for k, v in given.items() if v is not None} or None  # the rest: pair_probabilities' defaults
    result = calibrate(manifest, table, args.out, eta_meta=meta, norm=args.norm, fit_split=args.fit_split,
                       sampling=sampling)
    from medclr.lm.calibrate import ORACLES, STAT_KEYS

    print(json.dumps({"out": args.out, "pairs": result["n_pairs"],
                      **{k: result[k] for k in ("mean_q", "mean_rho", "spearman_q_rho", "eta_max")},
                      "variants": {name: {o: {k: v[o][k] for k in STAT_KEYS} for o in ORACLES}
                                   for name, v in result["variants"].items()}}))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from medclr.lm.eta import read_eta_table
    from medclr.lm.report import describe

    table, meta = read_eta_table(args.eta)
    result = describe(table, args.out, meta=meta)
    print(json.dumps({"out": args.out, "distinct_sentences": result["distinct_sentences"],
                      "spearman_pll_logcount": result["spearman_pll_logcount"]}))
    return 0


def _progress(args: argparse.Namespace) -> bool:
    """Bars when stderr is a terminal and --no-progress is not given; without ours, none of the libraries' either."""
    from medclr.progress import progress_wanted

    return progress_wanted(args)
