"""`medclr train --config CFG [key=value ...] [--resume [CKPT]]`.

One process: ``medclr train --config dcl_lm data.manifest=M data.eta=E out=RUN``.
Many processes (GPUs, or CPU/gloo): ``torchrun --nproc_per_node=N -m medclr train --config ...``;
train.batch_size is the global batch. Bad input stops every rank with one line before any work.
"""

from __future__ import annotations

import argparse
import json
import logging

from medclr.progress import add_progress_flag
from medclr.training.config import available_configs, load_config

HELP = "train image/report encoders with a contrastive loss (torchrun for many GPUs)"  # what `medclr --help` shows

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="CFG",
                        help=f"required: a YAML file, or the name of a config shipped with medclr: "
                             f"{', '.join(available_configs())} (`--show-config NAME` prints one)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. data.manifest=m.parquet data.eta=eta.parquet out=runs/a "
                             "optim.lr=1e-4 preset=paper (`medclr train --show-config` lists every key with its "
                             "default and what it does)")
    parser.add_argument("--resume", nargs="?", const="auto", default=None, metavar="CKPT",
                        help="continue the run in `out` from its latest checkpoint (or from CKPT, a step directory)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--show-config", nargs="?", const="base", default=None, metavar="NAME",
                        help="print a shipped config file as it is, comments included, and exit (default: base, "
                             "every key with its default); a method name (dcl_lm) or a preset (preset_cpu_small)")
    add_progress_flag(parser)  # the same as log.progress=false
    parser.set_defaults(run=run)


def _show_config(name: str) -> int:
    from medclr.errors import MedclrError
    from medclr.training.config import CONFIG_DIR

    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
        raise MedclrError(f"--show-config {name!r}: not a shipped config (names: {', '.join(names)})")
    print(path.read_text(encoding="utf-8"), end="")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.show_config is not None:
        return _show_config(args.show_config)
    if args.config is None:
        from medclr.errors import MedclrError

        raise MedclrError("--config CFG is required: a YAML file or one of "
                          f"{', '.join(available_configs())} (`medclr train --show-config` prints the defaults)")
    overrides = list(args.overrides) + (["log.progress=false"] if args.no_progress else [])
    cfg = load_config(args.config, overrides)
    if args.print_config:
        from medclr.training.config import dump_yaml

        print(dump_yaml(cfg), end="")
        return 0
    from medclr.progress import show_progress, silence_library_bars

    if not show_progress(cfg["log"]["progress"]):
        silence_library_bars()  # transformers' "Writing model shards" and the like follow training's own bar
    from medclr.training.loop import train  # torch and the models load only now

    summary = train(cfg, resume=args.resume)
    from medclr.distributed import env_world

    if env_world()[0] == 0:
        print(json.dumps({"train": summary}, default=str))
    return 0
