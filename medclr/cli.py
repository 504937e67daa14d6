"""The `medclr` command line.

Each subcommand lives in the module that implements it and exposes
``configure(parser)``, which adds its arguments and sets ``run`` with
``parser.set_defaults(run=callable)``. Only the chosen subcommand's module is
imported, so `medclr --help` is instant and `medclr` (a core package) does not
import `training`, `evaluation` or `app` unless asked to.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys

from medclr.errors import MedclrError

# name -> (module implementing it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "phantom": ("medclr.phantom.cli", "generate a CXR-Phantom image-report data set with ground truth"),
    "inspect": ("medclr.io.cli", "show the safe header fields of a radiograph and render it as medclr reads it"),
    "prepare": ("medclr.data.cli", "read MIMIC-CXR-JPG / Open-i / a CSV corpus (+ MS-CXR) into a manifest"),
    "lm": ("medclr.lm.cli", "fit a domain masked LM, score sentences (PLL -> eta), calibrate eta"),
    "train": ("medclr.training.cli", "train image/report encoders with a contrastive loss (torchrun for many GPUs)"),
    "eval": ("medclr.evaluation.cli", "CheX5 zero-shot, MS-CXR grounding, retrieval, probes -> metrics.json + report"),
    "index": ("medclr.index.cli", "build or extend a faiss retrieval index from a checkpoint"),
    "score": ("medclr.app.score", "batch-score a directory tree of radiographs, resumably"),
    "app": ("medclr.app.cli", "serve the clinician web app (Gradio) on 127.0.0.1"),
    "demo": ("medclr.app.demo", "the main job: phantom data -> LM -> train -> eval -> index -> app"),
}


def _not_built(name: str):
    def run(_args: argparse.Namespace) -> int:
        print(f"medclr {name}: not built yet in this version", file=sys.stderr)
        return 2

    return run


def _configure(name: str, parser: argparse.ArgumentParser) -> None:
    module_name = COMMANDS[name][0]
    if importlib.util.find_spec(module_name) is None:
        parser.set_defaults(run=_not_built(name))
        return
    importlib.import_module(module_name).configure(parser)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medclr",
        description="medclr: pretrain, evaluate and serve chest X-ray vision-language models "
        "with false-negative-aware contrastive losses. `medclr COMMAND --help` explains each command.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (_module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            _configure(name, p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except MedclrError as exc:
        print(f"medclr {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"medclr {args.command}: interrupted", file=sys.stderr)
        return 130
