"""`medclr inspect`: show what medclr reads from a radiograph (safe header fields, intensity) and render it."""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np
from PIL import Image

from medclr.errors import MedclrError
from medclr.io import read_header, read_image
from medclr.io.limits import image_problem  # the check every scoring path makes

HELP = "show the safe header fields of a radiograph and render it as medclr reads it"  # what `medclr --help` shows

EPILOG = """examples:
  medclr inspect scan.dcm                 # view, size, spacing, photometric; never patient identifiers
  medclr inspect scan.dcm --png scan.png  # the image as medclr sees it (air dark, bone bright)"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("image", help="DICOM, PNG or JPEG file")
    parser.add_argument("--png", metavar="OUT", help="write the decoded image as an 8-bit PNG")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    header = read_header(args.image)
    image = read_image(args.image)
    problem = image_problem(image)
    if problem:
        raise MedclrError(f"{args.image}: {problem}")
    header.update({"decoded_shape": list(image.shape), "mean_intensity": round(float(image.mean()), 4)})
    if header["blanked"]:  # a damaged or crafted header: its value is never printed (medclr.io.codes)
        logging.getLogger(__name__).warning(
            "inspect: %s: the header's value is not a DICOM code string or UID; shown as \"\"",
            ", ".join(header["blanked"]))
    print(json.dumps(header, indent=2))
    if args.png:
        Image.fromarray(np.round(image * 255).astype(np.uint8)).save(args.png)
        print(f"wrote {args.png}")
    return 0
