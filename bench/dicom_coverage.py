"""How many real DICOMs with pixel data medclr's reader decodes: pydicom's test files + pydicom-data.

Every file under pydicom's ``data/test_files`` and pydicom-data's ``data_store/data`` (recursively) that
``pydicom.dcmread`` opens and that holds pixel data is decoded with ``medclr.io.dicom.decode_pixels``
(the decode step of ``read_dicom_with_caution``: first frame, pydicom's plugins). A file whose decode raises counts
as failed, grouped by transfer syntax with its one-line error. ``read_dicom_with_caution``'s later refusals (a
non-radiograph modality) are not decode failures and are not counted here.

    python bench/dicom_coverage.py [-v]
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pydicom  # noqa: E402

from medclr.errors import ImageReadError  # noqa: E402
from medclr.io.dicom import decode_pixels  # noqa: E402


def roots() -> list[Path]:
    out = [Path(pydicom.__file__).parent / "data" / "test_files"]
    try:
        import data_store  # pydicom-data

        out.append(Path(data_store.__file__).parent / "data")
    except ImportError:
        print("pydicom-data not installed: pydicom's own test files only", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failure")
    args = ap.parse_args()
    total, failed = 0, collections.defaultdict(list)
    for root in roots():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            try:
                ds = pydicom.dcmread(path)
            except Exception:
                continue  # not a DICOM file (or a deliberately broken header)
            if not any(k in ds for k in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
                continue
            total += 1
            syntax = str(getattr(ds, "file_meta", {}).get("TransferSyntaxUID", "?"))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    decode_pixels(path, ds)
            except ImageReadError as exc:
                failed[syntax].append(f"{path.relative_to(root.parent)}: {str(exc).split(': ', 1)[1]}")
    n_failed = sum(len(v) for v in failed.values())
    print(f"{total - n_failed} of {total} DICOMs with pixel data decode ({n_failed} fail)")
    for syntax, lines in sorted(failed.items(), key=lambda kv: -len(kv[1])):
        name = getattr(pydicom.uid.UID(syntax), "name", syntax)
        print(f"  {len(lines):3d}  {syntax}  {name}")
        for line in lines if args.verbose else lines[:1]:
            print(f"         {line[:200]}")


if __name__ == "__main__":
    main()
