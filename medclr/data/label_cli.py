"""`medclr label`: CheX5 labels read from each report by rules (``medclr.data.labeller``), for a corpus without."""

from __future__ import annotations

import argparse
import json

HELP = "label a manifest's reports for the CheX5 findings by rules (1 / 0 / -1 / blank)"  # `medclr --help`

EPILOG = """examples:
  medclr label --manifest mine.parquet --out mine.labelled.parquet
  medclr label --manifest openi.parquet --out openi.rules.parquet --overwrite   # replace the labels it has
  medclr label --manifest mine.parquet --out mine.labelled.parquet --truth checked.parquet   # how good are they?

Per report and class: 1 when a sentence states the finding, -1 when one hedges it ("possible effusion", "no
change in the effusion"), 0 when one negates it ("No pneumothorax.", "Heart size is normal."), blank when
none mentions it; a positive mention wins, then an uncertain one (CheXpert's rule). Columns that already
hold labels are kept unless --overwrite. Prints how many reports each class labelled, per value.

--truth: a manifest with CheX5 labels someone trusts for some of these reports (`medclr prepare --csv` of a
hand-labelled sample, a CXR-Phantom's own manifest), matched by dicom_id. Per class it prints the rules'
agreement with it on whether a report states the finding (1 against 0 / -1 / blank), Cohen's kappa of that
call, and what the rules called the truth's positives (a hedge read as -1 is the usual miss)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--manifest", required=True, metavar="PARQUET", help="a manifest (`medclr prepare`)")
    parser.add_argument("--out", required=True, metavar="PARQUET", help="the labelled manifest to write")
    parser.add_argument("--overwrite", action="store_true", help="replace labels the manifest already has")
    parser.add_argument("--truth", metavar="PARQUET",
                        help="a manifest with trusted CheX5 labels, matched by dicom_id: print the rules' agreement")
    parser.set_defaults(run=run)


def agreement_with(df, truth_path: str) -> dict:
    """The rules' agreement (``medclr.data.labeller.agreement``) with the labels of the manifest ``truth_path`` on
    the rows of ``df`` it has (by dicom_id), for the CheX5 classes it labels."""
    from medclr.data.labeller import agreement, label_manifest
    from medclr.data.labels import CHEX5
    from medclr.data.manifest import read_manifest
    from medclr.errors import MedclrError

    truth = read_manifest(truth_path)
    classes = [c for c in CHEX5 if c in truth and truth[c].notna().any()]
    if not classes:
        raise MedclrError(f"--truth {truth_path}: no CheX5 labels to compare with ({', '.join(CHEX5)})")
    repeated = truth["dicom_id"][truth["dicom_id"].duplicated()]
    if len(repeated):
        raise MedclrError(f"--truth {truth_path}: dicom_id {repeated.iat[0]!r} has more than one row")
    joined = df[["dicom_id", "sentences"]].merge(truth[["dicom_id", *classes]], on="dicom_id")
    if joined.empty:
        raise MedclrError(f"--truth {truth_path}: none of its dicom_ids is in the manifest (another data set?)")
    rules, _ = label_manifest(joined, classes, overwrite=True)
    return {"truth": str(truth_path), "n_matched": len(joined), "n_unmatched": len(df) - len(joined),
            "classes": agreement(rules, joined, classes)}


def run(args: argparse.Namespace) -> int:
    from medclr.data.labeller import label_manifest, value_counts
    from medclr.data.labels import CHEX5
    from medclr.data.manifest import read_manifest, write_manifest

    df = read_manifest(args.manifest)
    checked = agreement_with(df, args.truth) if args.truth else None  # before any work: a bad --truth fails fast
    labelled, filled = label_manifest(df, CHEX5, overwrite=args.overwrite)
    write_manifest(labelled, args.out, df.attrs.get("root") or None)
    summary = {"out": args.out, "rows": len(labelled), "labelled_by_rules": filled,
               "kept": [c for c in CHEX5 if c not in filled], "counts": {c: value_counts(labelled[c]) for c in CHEX5}}
    print(json.dumps(summary | ({"agreement": checked} if checked else {})))
    return 0
