"""The `medclr` command line.

Every subcommand, the core's and the outer parts' alike, is an entry point of the ``medclr.commands``
group in pyproject.toml, ``name = "module:configure"``. ``configure(parser)`` adds the command's
arguments and sets ``run`` with ``parser.set_defaults(run=callable)``; a ``HELP = "..."`` line in the
same module is its one-line help. So the core names no outer package, and a command is added without
editing this file. Only the chosen subcommand's module is imported: `medclr --help` reads each HELP
line from the module's source without running it or the packages above it, and stays fast.
"""

from __future__ import annotations

import argparse
import ast
import errno
import logging
import os
import re
import sys
from pathlib import Path

from medclr import __version__
from medclr.errors import MedclrError

GROUP = "medclr.commands"
_HELP_LINE = re.compile(r"^HELP = (.+)$", re.MULTILINE)


def commands() -> dict:
    """The registered subcommands, name -> ``importlib.metadata.EntryPoint``, sorted by name.

    Read from medclr's own distribution (about 1 ms): ``entry_points(group=...)`` reads the entry
    points of every installed distribution (15-25 ms beside torch, gradio and the rest), and no other
    package can shadow a medclr command."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        registered = distribution("medclr").entry_points.select(group=GROUP)
    except PackageNotFoundError:
        return {}
    return {ep.name: ep for ep in sorted(registered, key=lambda ep: ep.name)}


def _meta_path_spec(name: str, path):
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec
    return None


def _find_spec_unrun(module: str):
    """The spec of ``module``, found as ``import`` finds it but without running the packages above it
    (``importlib.util.find_spec`` imports them, and ``medclr.io`` alone takes most of a second)."""
    parts = module.split(".")
    spec = _meta_path_spec(parts[0], None)
    for depth in range(2, len(parts) + 1):
        if spec is None or spec.submodule_search_locations is None:
            return None  # not there, or a module where a package should be
        spec = _meta_path_spec(".".join(parts[:depth]), spec.submodule_search_locations)
    return spec


def is_built(name: str) -> bool:
    """Whether the subcommand ``name`` is registered and its module is there (nothing is imported)."""
    ep = commands().get(name)
    return ep is not None and _find_spec_unrun(ep.module) is not None


def command_help(source: str) -> str:
    """The ``HELP = "..."`` line of a command module's source ("" when it has none)."""
    match = _HELP_LINE.search(source)
    try:
        return str(ast.literal_eval(match.group(1))) if match else ""
    except (ValueError, SyntaxError):
        return ""


def _help(ep) -> str:
    spec = _find_spec_unrun(ep.module)
    if spec is None or not spec.origin:
        return "(not built in this version)"
    try:
        return command_help(Path(spec.origin).read_text(encoding="utf-8"))
    except OSError:
        return ""


def _not_built(name: str):
    def run(_args: argparse.Namespace) -> int:
        print(f"medclr {name}: not built yet in this version", file=sys.stderr)
        return 2

    return run


def _configure(name: str, ep, parser: argparse.ArgumentParser) -> None:
    if _find_spec_unrun(ep.module) is None:
        parser.set_defaults(run=_not_built(name))
        return
    ep.load()(parser)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    registered = commands()
    if not registered:
        raise MedclrError(f"no subcommands are registered (the {GROUP} entry points): install medclr, "
                          "e.g. `pip install -e .` in a checkout")
    parser = argparse.ArgumentParser(
        prog="medclr",
        description="medclr: pretrain, evaluate and serve chest X-ray vision-language models "
        "with false-negative-aware contrastive losses. `medclr COMMAND --help` explains each command.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"medclr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, ep in registered.items():
        help_text = _help(ep)
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            _configure(name, ep, p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(argv)
    except MedclrError as exc:
        print(f"medclr: error: {exc}", file=sys.stderr)
        return 2
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
    except Exception as exc:
        refused = refused_write(exc)
        if refused is None:
            raise
        # every writer replaces its file atomically, so what was there before is intact; say where and stop
        why, where = refused
        where = where or getattr(args, "out", None) or "the output"
        print(f"medclr {args.command}: error: {why} while writing {where}; earlier files are intact: free some "
              "space (or raise the limit) and rerun the same command (it resumes)", file=sys.stderr)
        return 1


# Writes the disk refuses: no space, no quota left, a file over the size limit (ulimit -f, RLIMIT_FSIZE).
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = {errno.ENOSPC: "no space left on the disk", errno.EDQUOT: "the disk quota is used up",
            errno.EFBIG: "a file grew past the file size limit (ulimit -f)",
            None: "the disk took only part of a write (full, over quota or over a file size limit)"}
# Libraries that raise no OSError keep the reason in their words: safetensors "(os error 28)", faiss "(No space
# left on device)"; torch.save to a path and numpy's tofile only say that a write came up short.
_FULL_WORDS = re.compile("|".join([*(re.escape(os.strerror(e)) for e in _FULL_ERRNOS),
                                   *(rf"os error {e}\b" for e in _FULL_ERRNOS),
                                   r"\d+ requested and \d+ written", r"unexpected pos \d+ vs \d+",
                                   r"PytorchStreamWriter failed writing"]))


def _chain(exc: BaseException | None):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def refused_write(exc: BaseException) -> tuple[str, str | None] | None:
    """(why, the file it names) when ``exc`` or an exception in its chain (cause, context) says that the disk
    refused a write, else None: the errno where a library kept it, else the library's words."""
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return _REFUSED[e.errno], e.filename
    for e in chain:
        text = str(e)
        if _FULL_WORDS.search(text):
            code = next((c for c in _FULL_ERRNOS if os.strerror(c) in text or re.search(rf"os error {c}\b", text)),
                        None)
            return _REFUSED[code], None
    return None


if __name__ == "__main__":
    sys.exit(main())
