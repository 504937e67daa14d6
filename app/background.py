"""The app served from this process on a free local port, stopped when the block ends.

What the tests and the benchmarks start (``medclr app`` serves in the foreground instead). Gradio
loads on first use, so importing this module for :func:`free_port` stays light.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from medclr.app.service import AppService


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_background(service: AppService, **launch_kw) -> Iterator[str]:
    """Serve ``service``'s web app on 127.0.0.1 at a free port; yields its URL without the trailing
    slash. ``launch_kw`` go to :func:`medclr.app.ui.launch` (auth, max_file_size, ...)."""
    from medclr.app.ui import build_blocks, launch

    demo = build_blocks(service)
    _, url = launch(demo, port=free_port(), block=False, **launch_kw)
    try:
        yield url.rstrip("/")
    finally:
        demo.close()
