"""`medclr prepare`: read a data source into a manifest (and MS-CXR boxes into a table beside it)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from medclr.data.manifest import write_manifest
from medclr.errors import MedclrError
from medclr.progress import add_progress_flag, progress_wanted

HELP = "read MIMIC-CXR-JPG / Open-i / a CSV corpus (+ MS-CXR) into a manifest"  # what `medclr --help` shows

log = logging.getLogger(__name__)

EPILOG = """examples:
  medclr prepare --openi --out openi.parquet                  # the 3,955 Open-i reports shipped in torchxrayvision
  medclr prepare --mimic /data/mimic-cxr-jpg --reports /data/mimic-cxr --out mimic.parquet
  medclr prepare --mimic phantom/ --views all --mscxr phantom/MS_CXR_Local_Alignment_v1.1.0.csv --out m.parquet
  medclr prepare --csv my_reports.csv --drop-empty --out mine.parquet
  medclr prepare --csv export.csv --image-col file --report-col findings_text --out mine.parquet
  medclr prepare --csv export.csv --study-col accession --subject-col patient --out mine.parquet

The manifest has one row per image-report pair (columns: index, subject_id, study_id,
dicom_id, image_path, view, split, report, text, sentences, 14 CheXpert labels).
With --mscxr, the boxes go to <out stem>.mscxr.parquet with the manifest index of each image.
With --csv, the splits keep subjects apart (a hashed split never puts one subject in two). Without a
study column each row is a study of its own, and without a subject column each study a subject of its
own; those ids come from the image path (img-<12 hex digits>), and one line says so."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--mimic", metavar="ROOT", help="MIMIC-CXR-JPG root (files/ + mimic-cxr-2.0.0-*.csv.gz)")
    src.add_argument("--openi", nargs="?", const="", metavar="PATH",
                     help="Open-i reports (NLMCXR_reports.tgz or folder; default: the copy in torchxrayvision)")
    src.add_argument("--csv", metavar="FILE",
                     help="a corpus CSV: image_path,report[,split,study_id,subject_id,labels...]")
    parser.add_argument("--image-col", default="image_path", metavar="NAME",
                        help="--csv: the column holding image paths (default image_path)")
    parser.add_argument("--report-col", default="report", metavar="NAME",
                        help="--csv: the column holding report text (default report)")
    parser.add_argument("--split-col", default=None, metavar="NAME",
                        help="--csv: the column holding train/validate/test (default split, when present)")
    parser.add_argument("--study-col", default=None, metavar="NAME",
                        help="--csv: the column holding study ids, the rows of one report (default study_id, when "
                             "present; else each row its own study)")
    parser.add_argument("--subject-col", default=None, metavar="NAME",
                        help="--csv: the column holding patient ids, which splits keep apart (default subject_id, "
                             "when present; else each study its own subject)")
    parser.add_argument("--out", required=True, metavar="PARQUET", help="manifest to write")
    parser.add_argument("--mscxr", metavar="CSV", help="MS-CXR box CSV to attach (MS_CXR_Local_Alignment_v1.1.0.csv)")
    parser.add_argument("--reports", metavar="ROOT", help="MIMIC: where files/pXX/pSUBJECT/sSTUDY.txt live (default: ROOT)")
    parser.add_argument("--views", default="PA,AP", help="MIMIC: comma-separated views to keep, or 'all' (default: PA,AP)")
    parser.add_argument("--image-ext", default="jpg", help="MIMIC: image extension, jpg or dcm (default: jpg)")
    parser.add_argument("--drop-empty", action="store_true", help="skip reports without findings/impression text")
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the hashed split when the source has none")
    add_progress_flag(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.mimic:
        from medclr.data.readers.mimic import read_mimic_cxr_jpg

        views = None if args.views.strip().lower() == "all" else tuple(v.strip() for v in args.views.split(",") if v.strip())
        df = read_mimic_cxr_jpg(args.mimic, args.reports, views, args.image_ext, args.drop_empty,
                                progress=progress_wanted(args))
        root = Path(args.mimic)
        from medclr.data.groundtruth import GROUND_TRUTH_FILE, attach_ground_truth

        if (root / GROUND_TRUTH_FILE).is_file():  # a CXR-Phantom set: carry its latent classes along
            df = attach_ground_truth(df, root)
    elif args.csv:
        from medclr.data.readers.csv_corpus import read_csv_corpus

        columns = {"image_path": args.image_col, "report": args.report_col,
                   **{k: v for k, v in (("split", args.split_col), ("study_id", args.study_col),
                                        ("subject_id", args.subject_col)) if v}}
        df = read_csv_corpus(args.csv, args.drop_empty, args.split_seed, columns)
        root = Path(args.csv).resolve().parent
    else:
        from medclr.data.readers.openi import read_openi

        df = read_openi(args.openi or None, args.split_seed)
        root = None
    write_manifest(df, out, root)
    n_sent = sum(len(s) for s in df["sentences"])
    print(f"wrote {out}: {len(df)} rows, {n_sent} sentences, splits {df['split'].value_counts().to_dict()}")
    if args.mscxr:
        from medclr.data.readers.mscxr import read_mscxr

        boxes = read_mscxr(args.mscxr)
        lookup = dict(zip(df["dicom_id"], df["index"]))
        boxes["index"] = np.array([lookup.get(d, -1) for d in boxes["dicom_id"]], dtype=np.int64)
        unmatched = int((boxes["index"] < 0).sum())
        if unmatched == len(boxes):
            raise MedclrError(f"{args.mscxr}: none of its dicom_ids is in the manifest (wrong data set or --views?)")
        box_out = out.with_name(out.stem + ".mscxr.parquet")
        boxes.to_parquet(box_out, index=False)
        print(f"wrote {box_out}: {len(boxes)} boxes, {boxes['phrase_id'].nunique()} phrases ({unmatched} boxes without image)")
    return 0
