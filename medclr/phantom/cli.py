"""`medclr phantom`: write a CXR-Phantom data set (MIMIC-CXR-JPG layout, MS-CXR boxes, ground truth)."""

from __future__ import annotations

import argparse
import logging
import os

from medclr.errors import MedclrError
from medclr.phantom.vocab import EVAL_PER_CLASS, VAL_PER_CLASS
from medclr.progress import NO_PROGRESS_HELP, progress_wanted

HELP = "generate a CXR-Phantom image-report data set with ground truth"  # what `medclr --help` shows

EPILOG = """\
what it writes (DIR):
  files/pXX/pSUBJECT/sSTUDY/DICOM_ID.jpg   the radiograph (+ .dcm with --dicom: CR, MONOCHROME1)
  files/pXX/pSUBJECT/sSTUDY.txt            the report (FINDINGS: / IMPRESSION:)
  mimic-cxr-2.0.0-{metadata,split,chexpert}.csv.gz   MIMIC-CXR-JPG's own columns
  MS_CXR_Local_Alignment_v1.1.0.csv        boxes + sentences of the test split (MS-CXR columns)
  phantom_ground_truth.parquet             per study: latent class, its probability, findings, boxes
  phantom_classes.csv, phantom.json        class table and run summary

sources:
  openi      each real Open-i report (3,832 indexed ones) drawn as it reads (MeSH-linked findings)
  composed   finding sets sampled from CheXpert label co-occurrence, text from real Open-i sentences
  both       even studies openi, odd studies composed

evaluation sets (the test split, on subjects of their own, added to the N pool studies):
  CheX5       K studies per CheX5 class with that class positive and the other four negative
              (single-positive, as the paper's CheX5 set): >= K positives, >= 4K negatives per class
  grounding   every CheX5 study above plus K/5 per other MS-CXR category (atelectasis, consolidation,
              lung opacity): MS-CXR boxes over 8 categories
  The pool's --split default puts no pool study in test; phantom.json counts both sets.

examples:
  medclr phantom --out data/phantom --n 2000
  medclr phantom --out data/ph512 --n 500 --size 512 --source openi --dicom
  medclr phantom --out data/big --n 100000 --source composed --workers 2

The same --seed gives the same bytes whatever --workers is. Read it back with
medclr.data.readers.mimic.read_mimic_cxr_jpg(DIR) and join the ground truth with
medclr.phantom.attach_ground_truth(manifest, DIR).
"""


def _split(text: str) -> tuple[float, float]:
    try:
        parts = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected TRAIN,VALIDATE[,TEST] fractions such as 0.8,0.1,0.1") from None
    if len(parts) not in (2, 3) or any(p < 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected two or three non-negative fractions")
    if len(parts) == 3:
        total = sum(parts)
        if total <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: fractions sum to 0")
        parts = [p / total for p in parts]
    return parts[0], parts[1]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = ("Generate CXR-Phantom: phantom chest radiographs paired with real report text, "
                          "with known latent classes and lesion boxes, in MIMIC-CXR-JPG / MS-CXR formats.")
    parser.epilog = EPILOG
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (new or empty)")
    parser.add_argument("--n", type=int, default=1000, metavar="N", help="number of studies (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--source", choices=("openi", "composed", "both"), default="both",
                        help="where findings and text come from (default both)")
    parser.add_argument("--size", type=int, default=256, metavar="PX", help="image side in pixels, 64..1024 (default 256)")
    parser.add_argument("--dicom", action="store_true", help="also write DICOM (CR, MONOCHROME1, synthetic ids)")
    parser.add_argument("--workers", type=int, default=None, metavar="W",
                        help=f"processes (default: all {os.cpu_count()} cores; 1 = no pool)")
    parser.add_argument("--split", type=_split, default=(0.9, 0.1), metavar="TR,VA[,TE]",
                        help="train/validate/test fractions of the N pool studies by subject (default 0.9,0.1,0: "
                             "the test split is the evaluation sets)")
    parser.add_argument("--eval-per-class", type=int, default=EVAL_PER_CLASS, metavar="K",
                        help=f"evaluation sets (the test split, subjects of their own, on top of N): K single-positive "
                             f"studies per CheX5 class and K/5 per other MS-CXR category (default {EVAL_PER_CLASS}; "
                             "0 = none)")
    parser.add_argument("--eval-normal", type=int, default=None, metavar="K",
                        help="normal studies (no finding) in the test split, after the evaluation sets "
                             "(default: K/5 of --eval-per-class; 0 = none)")
    parser.add_argument("--val-per-class", type=int, default=VAL_PER_CLASS, metavar="K",
                        help=f"balanced validation studies (split validate, subjects of their own, on top of N): K "
                             f"single-positive studies per CheX5 class, on which training calibrates each finding's "
                             f"zero-shot score (default {VAL_PER_CLASS}; 0 = none)")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality (default 95, as MIMIC-CXR-JPG)")
    parser.add_argument("--overwrite", action="store_true", help="replace a phantom data set already in --out")
    parser.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true", help=NO_PROGRESS_HELP)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from medclr.phantom.dataset import generate

    if args.workers is not None and args.workers < 1:
        raise MedclrError(f"--workers {args.workers}: expected 1 or more")
    if not (1 <= args.quality <= 100):
        raise MedclrError(f"--quality {args.quality}: expected 1..100")
    summary = generate(args.out, args.n, seed=args.seed, source=args.source, size=args.size, dicom=args.dicom,
                       workers=args.workers, fractions=args.split, quality=args.quality, overwrite=args.overwrite,
                       progress=progress_wanted(args), eval_per_class=args.eval_per_class,
                       val_per_class=args.val_per_class, eval_normal=args.eval_normal)
    logging.getLogger(__name__).info(
        "wrote %d studies (%s) to %s: %d latent classes, %d MS-CXR boxes in the test split",
        summary["n_total"], ", ".join(f"{k} {v}" for k, v in summary["splits"].items()), args.out, summary["n_classes"],
        summary["mscxr_boxes"])
    return 0
