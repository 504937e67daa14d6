"""When a command draws progress bars: one rule for every bar medclr draws, and a switch for the bars of the
libraries it calls (transformers' "Writing model shards", huggingface_hub's downloads).

``auto`` (the default everywhere): bars when stderr is a terminal, none when it is piped to a log (a bar
redrawn into a file is thousands of partial lines); ``--no-progress`` / ``log.progress=false``: none, the
libraries' included; ``true``: always."""

from __future__ import annotations

import sys


def show_progress(setting: bool | str | None = "auto") -> bool:
    """Whether to draw bars: ``auto``/None follows stderr being a terminal, else the setting's truth."""
    if setting in ("auto", None):
        return sys.stderr.isatty()
    return bool(setting)


def silence_library_bars() -> None:
    """Turn off the bars of transformers and huggingface_hub for this process (medclr's own follow
    :func:`show_progress`)."""
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    disable_progress_bars()
