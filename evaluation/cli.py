"""`medclr eval`: zero-shot CheX5, MS-CXR grounding and retrieval, linear probe -> metrics.json + report.md.

Only argparse at import time; ``configure`` lists the tasks (``evaluation.tasks``, light modules), and
the heavy modules load when the command runs.
"""

from __future__ import annotations

import argparse
import os

from medclr.errors import MedclrError
from medclr.progress import add_progress_flag, progress_wanted

HELP = "CheX5 zero-shot, MS-CXR grounding, retrieval, probes -> metrics.json + report"  # what `medclr --help` shows

EPILOG = """\
examples:
  medclr eval --checkpoint runs/dcl_lm --manifest phantom/ --out runs/dcl_lm/eval
  medclr eval --checkpoint runs/dcl_lm --manifest work/manifest.parquet --out report/ --tasks zeroshot,grounding
  medclr eval --checkpoint runs/dcl_lm --manifest /data/mimic-cxr-jpg --prompts my_prompts.yaml --max-images 1000
  medclr eval --checkpoint runs/dcl_s0 --checkpoint runs/dcl_s1 --checkpoint runs/dcl_s2 --manifest phantom/ --out eval_seeds

--manifest (or --data) is a manifest parquet (from `medclr prepare`; MS-CXR boxes are read from <stem>.mscxr.parquet
beside it) or a MIMIC-CXR-JPG / CXR-Phantom root (MS_CXR_Local_Alignment_v*.csv inside it).
Writes OUT/metrics.json, OUT/report.md, OUT/figures/*.png and, when grounding or retrieval ran,
OUT/phrases.csv (per-phrase CNR, mIoU, retrieval ranks). Tasks: zeroshot (CheX5 AUC/ACC, test split
labels), grounding (CNR, mIoU per MS-CXR category), retrieval (RoIAlign box features vs phrases:
R@10/50/100, MedR, Recall), probe (logistic regression on train-split embeddings, 1/10/100 % labels;
t-SNE by latent class on the phantom). The protocol is pinned in docs/evaluation.md.

several checkpoints (--checkpoint repeated, e.g. one per training seed): each is evaluated alone,
exactly as above, into OUT/<k>_<checkpoint dir name>/ (k = 1, 2, ...; the last example writes
eval_seeds/1_dcl_s0/, 2_dcl_s1/, 3_dcl_s2/), and OUT/metrics.json + OUT/report.md pool them: mean ± sd
over checkpoints, n, the 95 % Student-t CI of the mean over seeds, and each checkpoint's value beside
it (with its bootstrap CI for zero-shot). OUT/metrics.json's "summary" holds the means and
"summary_sd" the sample sds; the full statistics are under "pooled". One --checkpoint: as before.

prompt file (--prompts, YAML or JSON):
  Cardiomegaly: {positive: [Cardiomegaly, The heart is enlarged], negative: Heart size normal}
"""


def _tasks(value: str) -> list[str]:
    from medclr.evaluation.tasks import task_names  # the task modules, light to import

    known = task_names()
    names = [t.strip() for t in value.split(",") if t.strip()]
    if not names or any(t not in known for t in names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(known)}, got {value!r}")
    return names


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return n


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, action="append", metavar="DIR",
                        help="a `medclr train` output directory (or a shipped model's name: `medclr models`); "
                        "repeat it to evaluate several (e.g. training seeds) and pool them: --checkpoint runs/s0 "
                        "--checkpoint runs/s1 (see below)")
    parser.add_argument("--manifest", "--data", dest="data", required=True, metavar="PATH",
                        help="manifest parquet (as the other commands name it; --data is the older spelling), or a "
                             "MIMIC-CXR-JPG / phantom root")
    parser.add_argument("--out", default="eval", metavar="DIR", help="output directory (default: ./eval)")
    parser.add_argument("--split", default="test", choices=("test", "validate", "train"),
                        help="manifest split for zero-shot and the probe's test side (default: test)")
    from medclr.evaluation.tasks import task_names

    parser.add_argument("--tasks", type=_tasks, default=None, metavar="LIST",
                        help=f"comma-separated: {','.join(task_names())} (default: all the data allows)")
    parser.add_argument("--prompts", metavar="FILE", help="paper (the paper's Table 2 CheX5 prompts), report "
                        "(ensembles phrased like report sentences, several per side) or a YAML/JSON prompt file "
                        "(default: the checkpoint's own set, the one the app uses: training's val.prompts)")
    parser.add_argument("--max-images", type=_positive, metavar="N", help="seeded sample of N images of --split")
    parser.add_argument("--max-train-images", type=_positive, default=2000, metavar="N",
                        help="probe: seeded sample of N train-split images (default: 2000)")
    parser.add_argument("--max-phrases", type=_positive, metavar="N", help="seeded sample of N MS-CXR phrases")
    parser.add_argument("--mscxr-split", default="auto", choices=("auto", "all", "train", "validate", "test"),
                        help="which MS-CXR phrases: auto = those on the evaluated --split images (default; no phrase "
                        "on a training image), all = every phrase (the paper's 1,162 pairs, when training excluded "
                        "MS-CXR images), or a split name of the MS-CXR file's own split column")
    parser.add_argument("--batch-size", type=_positive, default=32, help="images per forward (default: 32)")
    parser.add_argument("--workers", type=int, default=None, help="image-decoding workers (default: 0 on CPU, 4 on CUDA)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the zero-shot CIs (default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every sample, bootstrap and control (default: 0)")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=METRICS_JSON",
                        help="add another run's summary as a row of the report's Table 1 (repeatable), "
                        "e.g. random=eval_random/metrics.json")
    parser.add_argument("--no-figures", action="store_true", help="report.md without figures (faster)")
    add_progress_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # cheap checks first: a typo gets its one line before torch is even imported
    if not os.path.exists(args.data):
        raise MedclrError(f"--manifest {args.data!r}: no such file or directory (expected a manifest .parquet or a "
                          "MIMIC-CXR-JPG / CXR-Phantom root)")
    from medclr.pretrained import resolve

    checkpoints = []
    for c in args.checkpoint:
        try:  # a checkpoint folder, or a model shipped in the package by name (its files checked here, once)
            checkpoints.append(str(resolve(c)))
        except MedclrError as exc:
            raise MedclrError(f"--checkpoint: {exc}") from None
        if not os.path.isdir(checkpoints[-1]):
            raise MedclrError(f"--checkpoint {c!r}: no such directory (expected a `medclr train` output dir)")
    from medclr.prompts import BUILTIN_PROMPTS

    if args.prompts is not None and args.prompts not in BUILTIN_PROMPTS and not os.path.isfile(args.prompts):
        raise MedclrError(f"--prompts {args.prompts!r}: no such file (expected {' or '.join(BUILTIN_PROMPTS)}, or a "
                          "YAML or JSON prompt file)")
    compare = {}
    for item in args.compare:
        label, sep, path = item.partition("=")
        if not sep or not label or not os.path.isfile(path):
            raise MedclrError(f"--compare {item!r}: expected LABEL=PATH to an existing metrics.json")
        compare[label] = path
    import torch

    from medclr.evaluation.runner import evaluate

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    workers = args.workers if args.workers is not None else (4 if device.startswith("cuda") else 0)
    if workers < 0 or args.n_boot < 0:
        raise MedclrError("--workers and --n-boot must be >= 0")
    kwargs = dict(tasks=args.tasks, split=args.split, prompts_file=args.prompts, max_images=args.max_images,
                  max_train_images=args.max_train_images, max_phrases=args.max_phrases, mscxr_split=args.mscxr_split,
                  batch_size=args.batch_size, workers=workers, device=device, n_boot=args.n_boot, seed=args.seed,
                  figures=not args.no_figures, compare=compare, progress=progress_wanted(args))
    if len(checkpoints) == 1:
        m = evaluate(checkpoints[0], args.data, args.out, **kwargs)
        s, notes = m["summary"], m.get("summary_notes") or {}
        shown = ", ".join((f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}") + (f" ({notes[k]})" if k in notes else "")
                          for k, v in s.items() if v is not None)
        print(f"wrote {os.path.join(args.out, 'metrics.json')}: {shown} ({m['timing_s']['total']} s)")
        return 0
    from medclr.evaluation.seeds_report import mean_sd
    from medclr.evaluation.seeds_run import evaluate_seeds

    m = evaluate_seeds(checkpoints, args.data, args.out, **kwargs)
    shown = ", ".join(f"{k} {mean_sd(e)}" for k, e in m["pooled"]["summary"].items() if e["n"])
    print(f"wrote {os.path.join(args.out, 'metrics.json')} (pooled over {len(checkpoints)} checkpoints): {shown} "
          f"({m['timing_s']['total']} s)")
    return 0
