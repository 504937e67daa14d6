"""The package layout's rules, checked on the source (issue 16):

* what installs is ``medclr`` and its subpackages only: the repository's app/, training/ and
  evaluation/ install as medclr.app, medclr.training and medclr.evaluation, and pyproject's package
  list names every package folder (setuptools' find cannot see mapped folders, so a new subpackage
  must be added by hand: this test says which);
* no module imports the generic top-level names (``import app`` would work in a checkout, where the
  folder is on sys.path, and fail for every user of the wheel);
* dependencies point one way: the core (medclr/) never imports medclr.app, medclr.training or
  medclr.evaluation; the command table in medclr/cli.py names them as strings, loaded on demand.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAPPED = {"medclr.app": "app", "medclr.training": "training", "medclr.evaluation": "evaluation"}
OUTER = tuple(MAPPED)
GENERIC = ("app", "training", "evaluation")


def python_files(*folders: str):
    for folder in folders:
        yield from sorted((REPO / folder).rglob("*.py"))


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [f"{node.module}.{a.name}" for a in node.names]  # `from medclr import app` too
    return names


def test_pyproject_installs_every_package_under_medclr_and_nothing_else():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == MAPPED
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "medclr").rglob("__init__.py")}
    for package, folder in MAPPED.items():
        on_disk |= {package + "".join("." + part for part in p.parent.relative_to(REPO / folder).parts)
                    for p in (REPO / folder).rglob("__init__.py")}
    listed = set(setuptools["packages"])
    assert listed == on_disk, f"add to pyproject's packages: {sorted(on_disk - listed)}; " \
                              f"remove: {sorted(listed - on_disk)}"
    assert all(p == "medclr" or p.startswith("medclr.") for p in listed)


def test_no_module_imports_a_generic_top_level_name():
    offenders = [f"{path.relative_to(REPO)}: {name}" for path in python_files("medclr", *GENERIC, "tests", "bench")
                 for name in imported_modules(path) if name.split(".")[0] in GENERIC]
    assert not offenders, offenders


def test_the_core_never_imports_the_outer_packages():
    offenders = [f"{path.relative_to(REPO)}: {name}" for path in python_files("medclr")
                 for name in imported_modules(path) if name in OUTER or name.startswith(tuple(o + "." for o in OUTER))]
    assert not offenders, offenders
