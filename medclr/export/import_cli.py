"""`medclr import biovil`: BioViL / BioViL-T + CXR-BERT as published, as a medclr checkpoint, in seconds."""

from __future__ import annotations

import argparse
import json
import os

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. Encoding the ten prompts took 50-90 s
# with spinning threads on a busy 2-core machine, 10-17 s with sleeping ones (as `medclr score` sets it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HELP = "write a published model (BioViL or BioViL-T + CXR-BERT) as a medclr checkpoint, without a corpus"

BIOVIL_HELP = "BioViL or BioViL-T's image file + a CXR-BERT folder -> a checkpoint score, eval, app and export load"

EPILOG = """examples:
  medclr import biovil --image-weights biovil_image_resnet50_proj_size_128.pt \\
      --text /data/models/BiomedVLP-CXR-BERT-specialized --out runs/biovil
  medclr import biovil --image-weights biovil_t_image_model_proj_size_128.pt \\
      --text /data/models/BiomedVLP-BioViL-T --out runs/biovil_t
  medclr score --checkpoint runs/biovil --input xrays/ --out scores.parquet

The checkpoint holds the weights of the two files as they are (ResNet-50 with BioViL's projector, CXR-BERT's
[CLS] and projection head, the cosine head): the model `medclr train ... train.max_steps=0` writes from them,
without reading a corpus. It has no per-finding validation record, so its zero-shot probabilities are
uncalibrated ("not validated"); `medclr eval` measures it. Nothing is downloaded (docs/models.md)."""


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="import_command", metavar="{biovil}")
    parser.set_defaults(run=lambda _a: (parser.print_help(), 2)[1])
    p = sub.add_parser("biovil", help=BIOVIL_HELP, description=BIOVIL_HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image-weights", required=True, metavar="FILE",
                   help="hi-ml-multimodal's image model file: biovil_image_resnet50_proj_size_128.pt (BioViL) or "
                        "biovil_t_image_model_proj_size_128.pt (BioViL-T)")
    p.add_argument("--text", required=True, metavar="DIR",
                   help="a local CXR-BERT folder (config.json with model_type cxr-bert, its weights, vocab.txt), e.g. "
                        "microsoft/BiomedVLP-CXR-BERT-specialized; its remote code is never run")
    p.add_argument("--out", required=True, metavar="DIR", help="the checkpoint folder (written whole or not at all; an "
                   "earlier `medclr import` there is replaced)")
    p.add_argument("--resize", type=int, default=None,
                   help="shorter side before the crop, as the checkpoint records it (default 512, the papers')")
    p.add_argument("--crop", type=int, default=None,
                   help="centre crop the model sees (default 480 for BioViL, 448 for BioViL-T, the papers')")
    p.add_argument("--tau", type=float, default=None,
                   help="zero-shot temperature: P = sigmoid((s+ - s-) / tau) (default 0.07, what a "
                        "train.max_steps=0 run of the infonce config records)")
    p.add_argument("--max-length", type=int, default=None,
                   help="sentence tokens at most (default 64, medclr train's model.max_length)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace whatever --out holds (without it, a folder that is not an earlier import is refused)")
    p.set_defaults(run=run_biovil)


def run_biovil(args: argparse.Namespace) -> int:
    from medclr.export.published import MAX_LENGTH, TAU, import_biovil

    summary = import_biovil(args.image_weights, args.text, args.out, resize=args.resize, crop=args.crop,
                            tau=TAU if args.tau is None else args.tau,
                            max_length=MAX_LENGTH if args.max_length is None else args.max_length,
                            overwrite=args.overwrite)
    print(json.dumps(summary))
    return 0
