"""`medclr train --config CFG [key=value ...] [--resume [CKPT]]`.

One process: ``medclr train --config dcl_lm data.manifest=M data.eta=E out=RUN``.
Many processes (GPUs, or CPU/gloo): ``torchrun --nproc_per_node=N -m medclr train --config ...``;
train.batch_size is the global batch. Bad input stops every rank with one line before any work.
"""

from __future__ import annotations

import argparse
import json
import logging

from medclr.training.config import available_configs, load_config

HELP = "train image/report encoders with a contrastive loss (torchrun for many GPUs)"  # what `medclr --help` shows

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="CFG",
                        help=f"a YAML file, or a name in training/configs: {', '.join(available_configs())}")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. data.manifest=m.parquet data.eta=eta.parquet out=runs/a "
                             "optim.lr=1e-4 preset=paper (see training/configs/base.yaml for every key)")
    parser.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CKPT",
                        help="continue the run in `out` from its latest checkpoint (or from CKPT, a step directory)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        from medclr.training.config import dump_yaml

        print(dump_yaml(cfg), end="")
        return 0
    from medclr.training.loop import train  # torch and the models load only now

    summary = train(cfg, resume=args.resume)
    from medclr.distributed import env_world

    if env_world()[0] == 0:
        print(json.dumps({"train": summary}, default=str))
    return 0
