"""`medclr label`: CheX5 labels read from each report by rules (``medclr.data.labeller``), for a corpus without."""

from __future__ import annotations

import argparse
import json

HELP = "label a manifest's reports for the CheX5 findings by rules (1 / 0 / -1 / blank)"  # `medclr --help`

EPILOG = """examples:
  medclr label --manifest mine.parquet --out mine.labelled.parquet
  medclr label --manifest openi.parquet --out openi.rules.parquet --overwrite   # replace the labels it has

Per report and class: 1 when a sentence states the finding, -1 when one hedges it ("possible effusion", "no
change in the effusion"), 0 when one negates it ("No pneumothorax.", "Heart size is normal."), blank when
none mentions it; a positive mention wins, then an uncertain one (CheXpert's rule). Columns that already
hold labels are kept unless --overwrite. Prints how many reports each class labelled, per value."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--manifest", required=True, metavar="PARQUET", help="a manifest (`medclr prepare`)")
    parser.add_argument("--out", required=True, metavar="PARQUET", help="the labelled manifest to write")
    parser.add_argument("--overwrite", action="store_true", help="replace labels the manifest already has")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from medclr.data.labeller import label_manifest
    from medclr.data.labels import CHEX5
    from medclr.data.manifest import read_manifest, write_manifest

    df = read_manifest(args.manifest)
    labelled, filled = label_manifest(df, CHEX5, overwrite=args.overwrite)
    write_manifest(labelled, args.out, df.attrs.get("root") or None)
    counts = {c: {name: int((labelled[c] == v).sum()) for name, v in (("1", 1.0), ("0", 0.0), ("-1", -1.0))}
              | {"blank": int(labelled[c].isna().sum())} for c in CHEX5}
    print(json.dumps({"out": args.out, "rows": len(labelled), "labelled_by_rules": filled,
                      "kept": [c for c in CHEX5 if c not in filled], "counts": counts}))
    return 0
