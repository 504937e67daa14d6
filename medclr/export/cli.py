"""`medclr export`: a trained checkpoint as a Hugging Face folder with a model card, as ONNX or as TorchScript."""

from __future__ import annotations

import argparse

from medclr.export.exporter import FORMATS

HELP = "export a checkpoint for other tools: a Hugging Face folder with a model card, ONNX or TorchScript"

EPILOG = """examples:
  medclr export --checkpoint run/checkpoint --format hf --out run/hf --report run/eval
  medclr export --checkpoint run/checkpoint --format onnx --out run/onnx
  medclr export --checkpoint run/checkpoint --format torchscript --out run/torchscript

hf:          text/ (transformers' AutoModel + AutoTokenizer), image_encoder.safetensors,
             text_projection.safetensors, head.safetensors, config.json (architecture, preprocessing,
             prompts) and README.md, the model card (training data, metrics with CIs from --report,
             intended use, limitations).
onnx:        image_encoder.onnx, text_encoder.onnx, score.onnx (dynamic batch axes), tokenizer/,
             export.json (input size, normalisation, tau, prompts); checked against PyTorch with
             onnxruntime before it is kept. Needs `pip install 'medclr[export]'`.
torchscript: the same three graphs as .pt files for torch.jit.load, checked the same way.

OUT is replaced only when the export is complete (docs/export.md)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a `medclr train` checkpoint directory, or the name of a model shipped with medclr "
                        "(`medclr models`)")
    # checked in run(), not by argparse's choices, so a wrong name is one line rather than usage + error
    parser.add_argument("--format", required=True, metavar="{" + ",".join(FORMATS) + "}", dest="export_format",
                        help="hf: a Hugging Face folder with a model card; onnx; torchscript")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write (replaced when complete)")
    parser.add_argument("--report", metavar="EVAL_DIR", default=None,
                        help="a `medclr eval` output folder of this checkpoint (its metrics.json) for the model card")
    parser.add_argument("--batch", type=int, default=3, metavar="N",
                        help="images in the parity check of onnx/torchscript (default 3; the graphs are traced on 2, "
                             "so the check also proves the batch axis is free)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from medclr.export.exporter import export

    out = export(args.checkpoint, args.export_format, args.out, report=args.report, check_batch=args.batch)
    print(out)
    return 0
