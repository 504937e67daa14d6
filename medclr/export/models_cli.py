"""`medclr models`: the models shipped inside medclr (name, size, recipe, headline metrics, from the registry
``medclr.pretrained``); `medclr models pack` writes one from a trained checkpoint (:mod:`medclr.export.pack`).

The command lives in ``export`` beside the packer: the registry is a leaf that the checkpoint loader imports, so
what loads checkpoints (the packer) cannot live in it."""

from __future__ import annotations

import argparse
import json

HELP = "the models shipped with medclr, opened by name (--checkpoint NAME); `models pack` ships a checkpoint"

EPILOG = """examples:
  medclr models                      the shipped models: name, size, dtype, recipe, steps, headline metrics
  medclr models --json               the same as JSON (name, path, size_bytes and model.json's summary)
  medclr score --checkpoint NAME --input xrays/ --out scores.parquet      any --checkpoint takes a name
  medclr models pack runs/dcl_lm --name dcl-lm-r50 --fp16 --report runs/dcl_lm/eval --provenance runs/dcl_lm/record

A shipped model is a folder medclr/pretrained/NAME/ (or $MEDCLR_PRETRAINED_DIR/NAME/ when that is set) whose
every file is checked against its SHA256SUMS when it is opened. Nothing is downloaded (docs/models.md)."""

PACK_HELP = "write medclr/pretrained/NAME/ from a trained checkpoint (inference files, provenance, SHA256SUMS)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--json", action="store_true", help="print the list as JSON")
    sub = parser.add_subparsers(dest="models_command", metavar="{pack}")
    p = sub.add_parser("pack", help=PACK_HELP, description=PACK_HELP)
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="a `medclr train` output directory")
    p.add_argument("--name", required=True, help="the model's name: lower-case letters, digits, '.', '_', '-'")
    p.add_argument("--fp16", action="store_true",
                   help="store the weights as float16 (half the size; they load back into float32); the change "
                        "this makes to the CheX5 zero-shot probabilities is measured and reported")
    p.add_argument("--provenance", metavar="DIR", help="a folder copied into provenance/: the commands, the commit, "
                   "the seeds, the training log, anything that says how the model was made")
    p.add_argument("--report", metavar="EVAL_DIR", help="this checkpoint's `medclr eval` folder: its metrics are the "
                   "headline `medclr models` shows, and go into provenance/eval/ and the model card")
    p.add_argument("--images", nargs="+", metavar="FILE", help="the images the cast is measured on (default: "
                   "8 CXR-Phantom renders)")
    p.add_argument("--description", metavar="TEXT", help="one line `medclr models --json` shows")
    p.add_argument("--overwrite", action="store_true", help="replace a shipped model of that name")
    parser.set_defaults(run=run)


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def _headline(entry: dict) -> str:
    head = entry.get("headline") or {}
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in head.items()) or "-"


def _steps(entry: dict) -> str:
    steps, total = entry.get("steps"), entry.get("total_steps")
    return "-" if steps is None else f"{steps}/{total}" if total else str(steps)


def run(args: argparse.Namespace) -> int:
    if args.models_command == "pack":
        return _pack(args)
    from medclr.pretrained import available, root

    models = available()
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    if not models:
        print(f"no models ship in {root()}; `medclr models pack CHECKPOINT_DIR --name NAME` adds one")
        return 0
    rows = [("name", "size", "dtype", "steps", "recipe", "headline")]
    rows += [(m["name"], _mb(m["size_bytes"]), str(m.get("dtype") or "-"), _steps(m),
              m.get("error") or str(m.get("recipe") or "-"), _headline(m)) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def _command(args: argparse.Namespace) -> list[str]:
    """The `medclr models pack` command as parsed (whatever called main), for provenance/pack.json."""
    cmd = ["medclr", "models", "pack", str(args.checkpoint), "--name", args.name]
    cmd += ["--fp16"] * args.fp16 + ["--overwrite"] * args.overwrite
    for flag in ("provenance", "report", "description"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag}", str(getattr(args, flag))]
    return cmd + (["--images", *args.images] if args.images else [])


def _pack(args: argparse.Namespace) -> int:
    from medclr.export.pack import pack

    out = pack(args.checkpoint, args.name, fp16=args.fp16, provenance=args.provenance, report=args.report,
               images=args.images, description=args.description, overwrite=args.overwrite,
               command=_command(args))
    cast = out["cast"]
    print(f"packed {out['name']} into {out['path']}: {_mb(out['size_bytes'])} ({out['size_bytes']} bytes), "
          f"weights {out['dtype']}")
    print(f"the {out['dtype']} weights change the CheX5 zero-shot probabilities by at most "
          f"{cast['max_probability_change']:.2e} (the scores by {cast['max_score_change']:.2e}) on "
          f"{cast['images'] if isinstance(cast['images'], str) else str(cast['n_images']) + ' given images'}")
    return 0
