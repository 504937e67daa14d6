"""When a command draws progress bars: one rule for every bar medclr draws, and a switch for the bars of the
libraries it calls (transformers' "Writing model shards", huggingface_hub's downloads).

``auto`` (the default everywhere): bars when stderr is a terminal, none when it is piped to a log (a bar
redrawn into a file is thousands of partial lines); ``--no-progress`` / ``log.progress=false``: none, the
libraries' included; ``true``: always.

Every bar medclr draws is made by :func:`progress_bar` (``tests/test_progress.py`` checks that no other module
imports tqdm), and every long-running command takes ``--no-progress`` (:func:`add_progress_flag`), read by
:func:`progress_wanted`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from typing import Any

NO_PROGRESS_HELP = "no progress bars (there are none either when stderr is not a terminal, e.g. piped to a log)"


def show_progress(setting: bool | str | None = "auto") -> bool:
    """Whether to draw bars: ``auto``/None follows stderr being a terminal, else the setting's truth."""
    if setting in ("auto", None):
        return sys.stderr.isatty()
    return bool(setting)


def silence_library_bars() -> None:
    """Turn off the bars of transformers and huggingface_hub for this process (medclr's own follow
    :func:`show_progress`). Neither is imported for it (`medclr score` never loads transformers): one already loaded
    is switched off, one not yet loaded reads ``HF_HUB_DISABLE_PROGRESS_BARS`` when it is (transformers takes
    huggingface_hub's setting then)."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    else:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """The ``--no-progress`` switch every long-running command takes."""
    parser.add_argument("--no-progress", action="store_true", help=NO_PROGRESS_HELP)


def progress_wanted(args: argparse.Namespace) -> bool:
    """A command's bars: drawn when stderr is a terminal and ``--no-progress`` is not given; when they are not, the
    libraries' bars are silenced too."""
    show = not getattr(args, "no_progress", False) and show_progress()
    if not show:
        silence_library_bars()
    return show


def progress_bar(iterable: Iterable | None = None, *, enabled: bool | str | None = "auto", **kwargs: Any):
    """A tqdm bar under the rule above (``enabled``: a command's :func:`progress_wanted`, a config's
    ``log.progress``, or ``auto``), redrawn at most once a second; a disabled bar draws nothing and passes the
    iterable through."""
    from tqdm.auto import tqdm

    kwargs.setdefault("mininterval", 1.0)
    return tqdm(iterable, disable=not show_progress(enabled), **kwargs)
