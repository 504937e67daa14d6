"""The package layout's rules, checked on the source (issue 16):

* what installs is ``medclr`` and its subpackages only: the repository's app/, training/ and
  evaluation/ install as medclr.app, medclr.training and medclr.evaluation, and pyproject's package
  list names every package folder (setuptools' find cannot see mapped folders, so a new subpackage
  must be added by hand: this test says which);
* no module imports the generic top-level names (``import app`` would work in a checkout, where the
  folder is on sys.path, and fail for every user of the wheel);
* dependencies point one way (``CONTRACTS``): the outer parts (medclr.app, medclr.training,
  medclr.evaluation), bench/ and tests/ use the core (medclr/), never the reverse; inside the core
  medclr.io <- medclr.data <- medclr.phantom, and medclr.models / medclr.losses know no files; no
  import cycle inside a package (the last, medclr.lm's eta <-> eta_fit, went when `lm score`'s pipeline
  moved to medclr.lm.score; ``CYCLES_LEFT`` would name one that has to stay for a while), and none
  between the parts (:func:`part_of`: medclr's subpackages and modules, the outer packages, bench,
  tests; the last, medclr.index <-> medclr.inference, went when the index builder took its image batches
  from the engine it is handed and the `medclr index` command moved to medclr.jobs.index). The `medclr`
  command finds its subcommands through the ``medclr.commands`` entry points (pyproject), so the core
  names no outer module.

Why an own checker rather than import-linter: import-linter (grimp) builds its graph from import
statements only, and a back-arrow by string (``importlib.import_module("medclr.app.cli")``, a
command table of module names) is exactly how the core used to reach the outer parts. The checker
below reads every .py with ``ast`` and counts three kinds of reference, at any depth (function-level
and ``TYPE_CHECKING`` imports too): import statements, ``import_module`` / ``__import__`` calls with
a constant name, and string constants that are a dotted name of this project's modules.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
MAPPED = {"medclr.app": "app", "medclr.jobs": "jobs", "medclr.training": "training", "medclr.evaluation": "evaluation"}
OUTER = tuple(MAPPED)
GENERIC = ("app", "jobs", "training", "evaluation")
# folder -> the module name its files import as
FOLDERS = {"medclr": "medclr", **{folder: package for package, folder in MAPPED.items()},
           "bench": "bench", "tests": "tests"}
COMMANDS_GROUP = "medclr.commands"


def python_files(*folders: str, root: Path = REPO):
    """The .py files under ``folders`` of ``root``, not following links (a checkout may link medclr/app -> ../app)."""
    for folder in folders:
        for here, dirs, files in os.walk(root / folder):
            dirs.sort()
            yield from (Path(here) / f for f in sorted(files) if f.endswith(".py"))


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


# ---------------------------------------------------------------------------------------------------
# The import graph and its contracts
# ---------------------------------------------------------------------------------------------------

# A string that is a whole dotted name under one of these roots counts as a reference. The bare
# generic names are left out: "training.data.resize" is a config key, and the test above already
# refuses `import training`.
DOTTED = re.compile(r"(?:medclr|bench|tests)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
IMPORT_CALLS = ("import_module", "__import__")


@dataclass(frozen=True)
class Ref:
    source: str  # the referring module
    target: str  # the project module referred to
    how: str  # "import", "import_module" or "string"
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line} -> {self.target} ({self.how})"


def module_name(path: Path, root: Path = REPO) -> str:
    """``jobs/score.py`` -> ``medclr.jobs.score``; ``medclr/io/__init__.py`` -> ``medclr.io``."""
    folder, *rest = path.relative_to(root).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_sources(root: Path = REPO) -> dict[str, tuple[str, bool]]:
    """Every module of the project (or of a tree laid out like it, at ``root``): name -> (source text, is a package)."""
    return {module_name(p, root): (p.read_text(), p.name == "__init__.py") for p in python_files(*FOLDERS, root=root)}


def resolve(name: str, known: frozenset[str]) -> str | None:
    """The longest project module that ``name`` names or lies in (None: not this project's)."""
    parts = name.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in known), None)


def _import_call_name(node: ast.Call) -> ast.Constant | None:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    first = node.args[0] if node.args else None
    if called in IMPORT_CALLS and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first
    return None


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@functools.cache
def references(source: str, module: str, is_package: bool, known: frozenset[str]) -> list[Ref]:
    """What ``module`` (its ``source``) refers to among the ``known`` project modules."""
    found: list[tuple[str, str, int]] = []
    consumed: set[int] = set()  # the name strings of import calls, not counted again as plain strings
    nodes = list(ast.walk(ast.parse(source)))
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(a.name, "import", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
            for a in node.names:  # `from pkg import sub` refers to pkg.sub when that is a module
                found.append((f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, "import", node.lineno))
        elif isinstance(node, ast.Call) and (name := _import_call_name(node)) is not None:
            consumed.add(id(name))
            found.append((name.value, "import_module", node.lineno))
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in consumed \
                and DOTTED.fullmatch(node.value):
            found.append((node.value, "string", node.lineno))
    refs = {Ref(module, target, how, line) for name, how, line in found
            if (target := resolve(name, known)) is not None and target != module}
    return sorted(refs, key=lambda r: (r.line, r.target))


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@dataclass(frozen=True)
class Contract:
    """Modules in ``sources`` (minus ``except_sources``) must not refer to modules in ``targets``."""
    rule: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    except_sources: tuple[str, ...] = ()

    def covers(self, ref: Ref) -> bool:
        return (any(within(ref.source, s) for s in self.sources)
                and not any(within(ref.source, s) for s in self.except_sources)
                and any(within(ref.target, t) for t in self.targets))


# the core's packages that read or write files (radiographs, manifests, indexes, checkpoints)
FILE_LAYERS = ("medclr.io", "medclr.data", "medclr.phantom", "medclr.index", "medclr.inference")
CONTRACTS = (
    Contract("the core never names the outer parts, bench or tests", ("medclr",), (*OUTER, "bench", "tests"),
             except_sources=OUTER),
    *(Contract(f"{part} uses the core, not the other outer parts, bench or tests", (part,),
               (*(o for o in OUTER if o != part), "bench", "tests")) for part in OUTER),
    Contract("bench uses the core and the outer parts, not tests", ("bench",), ("tests",)),
    Contract("medclr.io knows no data or phantom (io <- data <- phantom)", ("medclr.io",),
             ("medclr.data", "medclr.phantom")),
    Contract("medclr.data knows no phantom (io <- data <- phantom)", ("medclr.data",), ("medclr.phantom",)),
    Contract("medclr.models knows no files", ("medclr.models",), FILE_LAYERS),
    Contract("medclr.losses knows no files", ("medclr.losses",), FILE_LAYERS),
)
# Every package's modules must not import each other in a circle (function-level imports count),
# except in these, which still have one (named, to be removed; the test fails once one is gone):
CYCLES_LEFT: dict[str, str] = {}
# Nor may the parts (:func:`part_of`) import each other in a circle, lazily or not: none is excused.

# Arrows the contracts refuse but that still exist, each named and why, to be removed: (source
# module, target package) -> why. The test below fails once one is gone, so that its line goes too.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def excused(ref: Ref) -> bool:
    return any(ref.source == s and within(ref.target, t) for s, t in KNOWN_EXCEPTIONS)


def broken_contracts(refs: list[Ref]) -> list[str]:
    return [f"{ref}: {c.rule}" for ref in refs for c in CONTRACTS if c.covers(ref) and not excused(ref)]


def cycles(refs: list[Ref], package: str) -> list[list[str]]:
    """The import cycles among the modules of ``package`` (each once, as a path back to its start)."""
    graph: dict[str, set[str]] = {}
    for r in refs:
        if within(r.source, package) and within(r.target, package):
            graph.setdefault(r.source, set()).add(r.target)
    return graph_cycles(graph)


def part_of(module: str) -> str | None:
    """The part a module belongs to, the node of the graph between packages: ``medclr.index.store`` ->
    ``medclr.index``, ``medclr.prompts`` -> itself, ``medclr.jobs.score`` -> ``medclr.jobs``, ``bench.x`` ->
    ``bench``. The root ``medclr`` is none: it is the namespace every module loads first, and holds only
    ``__version__`` (read from below) and ``medclr.load`` (which hands on to medclr.inference)."""
    parts = module.split(".")
    if parts[0] != "medclr":
        return parts[0]
    return ".".join(parts[:2]) if len(parts) > 1 else None


def package_cycles(refs: list[Ref]) -> list[list[str]]:
    """The import cycles among the parts (:func:`part_of`): a module of one part referring to a module of
    another is an arrow between them (each cycle once, as a path back to its start)."""
    graph: dict[str, set[str]] = {}
    for r in refs:
        source, target = part_of(r.source), part_of(r.target)
        if source and target and source != target:
            graph.setdefault(source, set()).add(target)
    return graph_cycles(graph)


def ties(cycle: list[str], refs: list[Ref]) -> str:
    """The references that make each arrow of a cycle of parts, for the failure message."""
    return "; ".join(", ".join(str(r) for r in refs if part_of(r.source) == a and part_of(r.target) == b)
                     for a, b in zip(cycle, cycle[1:]))


def graph_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a directed graph (node -> the nodes it points to), each as a path back to its start."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, path + [node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])
    return found


def project_references(sources: dict[str, tuple[str, bool]]) -> list[Ref]:
    known = frozenset(sources)
    return [r for name, (text, is_package) in sources.items() for r in references(text, name, is_package, known)]


@pytest.fixture(scope="module")
def refs() -> list[Ref]:
    return project_references(project_sources())


def test_dependencies_point_one_way(refs):
    broken = broken_contracts(refs)
    assert not broken, "\n" + "\n".join(broken)


def test_no_import_cycles(refs):
    packages = sorted({".".join(r.source.split(".")[:2]) for r in refs if r.source.startswith("medclr.")})
    assert "medclr.inference" in packages and "medclr.app" in packages
    found = [" -> ".join(c) for p in packages if p not in CYCLES_LEFT for c in cycles(refs, p)]
    assert not found, "\n" + "\n".join(found)


def test_no_import_cycles_between_packages(refs):
    """Lazy imports count: a function-level import runs as surely as one at the top, only later."""
    found = [f"{' -> '.join(c)} ({ties(c, refs)})" for c in package_cycles(refs)]
    assert not found, "\n" + "\n".join(found)


def test_every_cycle_left_still_exists(refs):
    gone = [p for p in CYCLES_LEFT if not cycles(refs, p)]
    assert not gone, f"no cycle left in {gone}: delete them from CYCLES_LEFT"


def test_every_known_exception_still_exists(refs):
    stale = [f"{s} -> {t}" for s, t in KNOWN_EXCEPTIONS
             if not any(r.source == s and within(r.target, t) for r in refs)]
    assert not stale, f"these arrows are gone: delete them from KNOWN_EXCEPTIONS: {stale}"


# --- the checker sees a planted back-arrow of each kind ----------------------------------------------

def _plant(module: str, source: str, is_package: bool = False) -> dict[str, tuple[str, bool]]:
    sources = project_sources()
    sources[module] = (source, is_package)
    return sources


CORE_TO_OUTER = "the core never names the outer parts"


@pytest.mark.parametrize("module, source, how, rule", [
    ("medclr.prompts", "import medclr.app.cli\n", "import", CORE_TO_OUTER),
    ("medclr.hub", "from medclr import training\n", "import", CORE_TO_OUTER),
    ("medclr.cli", "def f():\n    from medclr.training import cli\n", "import", CORE_TO_OUTER),
    ("medclr.cli", "import importlib\nimportlib.import_module('medclr.evaluation.cli')\n", "import_module",
     CORE_TO_OUTER),
    ("medclr.cli", "COMMANDS = {'app': ('medclr.app.cli', 'serve the app')}\n", "string", CORE_TO_OUTER),
    ("medclr.data.cli", "def run():\n    from medclr.phantom import attach_ground_truth\n", "import",
     "medclr.data knows no phantom"),
    ("medclr.io.raster", "from ..data import manifest\n", "import", "medclr.io knows no data"),
    ("medclr.models.dual", "from medclr.io import read_image\n", "import", "medclr.models knows no files"),
    ("medclr.losses.planted", "from medclr.inference import load_checkpoint\n", "import",
     "medclr.losses knows no files"),
    ("bench.bench_app", "from tests.conftest_app import free_port\n", "import", "bench uses the core and the outer"),
    ("medclr.app.cli", "from medclr.evaluation.report import markdown\n", "import", "medclr.app uses the core"),
])
def test_a_planted_back_arrow_is_reported(module, source, how, rule):
    broken = broken_contracts(project_references(_plant(module, source)))
    assert any(line.startswith(f"{module}:") and f"({how}): {rule}" in line for line in broken), broken


def test_a_planted_cycle_is_reported():
    planted = "def stats():\n    from medclr.inference.engine import Inference\n"
    found = cycles(project_references(_plant("medclr.inference.preprocess", planted)), "medclr.inference")
    assert any(c[0] == c[-1] and "medclr.inference.preprocess" in c and "medclr.inference.engine" in c
               for c in found), found


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_planted_cycle_between_packages_is_reported(tmp_path):
    """A small tree laid out like the project's, through the same reader and checker: medclr.low's builder imports
    medclr.high lazily, medclr.high imports medclr.low. No package has a cycle inside, so only the check between
    packages sees it; the root's ``__version__`` and ``load`` draw no cycle, and jobs/ on top adds none."""
    tree = _tree(tmp_path, {
        "medclr/__init__.py": '__version__ = "0"\n\ndef load():\n    from medclr.high import engine\n',
        "medclr/low/__init__.py": "from medclr.low.store import open_store\n",
        "medclr/low/store.py": "from medclr import __version__\n\ndef open_store():\n    pass\n\n"
                               "def build():\n    from medclr.high.engine import Engine\n",
        "medclr/high/__init__.py": "",
        "medclr/high/engine.py": "class Engine:\n    def retrieve(self):\n        from medclr.low import open_store\n",
        "jobs/__init__.py": "",
        "jobs/index.py": "from medclr.high.engine import Engine\nfrom medclr.low.store import build\n",
    })
    refs = project_references(project_sources(tree))
    assert {r.source for r in refs} >= {"medclr.low.store", "medclr.high.engine", "medclr.jobs.index"}
    assert not cycles(refs, "medclr.low") and not cycles(refs, "medclr.high")
    found = package_cycles(refs)
    assert found == [["medclr.high", "medclr.low", "medclr.high"]], found
    assert "medclr.low.store:7 -> medclr.high.engine (import)" in ties(found[0], refs)
    # the fix this repository took: the builder is handed what it needs, and imports nothing above it
    (tree / "medclr/low/store.py").write_text("def build(engine):\n    return engine.image_batches()\n")
    assert package_cycles(project_references(project_sources(tree))) == []


def test_the_index_inference_circle_would_be_reported():
    """The circle the checker between packages was written for, planted back into this repository."""
    source, is_package = project_sources()["medclr.index.store"]
    planted = source + "\n\ndef _loader():\n    from medclr.inference import image_loader\n"
    found = package_cycles(project_references(_plant("medclr.index.store", planted, is_package)))
    assert ["medclr.index", "medclr.inference", "medclr.index"] in found, found


def test_prose_and_config_keys_are_not_references():
    known = frozenset(project_sources())
    source = '"""See medclr.app.cli for the app."""\nKEYS = ("training.data.resize", "data.eta")\n'
    assert references(source, "medclr.prompts", False, known) == []


# ---------------------------------------------------------------------------------------------------
# The `medclr` subcommands: entry points, not a table in the core
# ---------------------------------------------------------------------------------------------------

def declared_commands() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][COMMANDS_GROUP]


def module_file(module: str) -> Path:
    """``medclr.jobs.score`` -> ``jobs/score.py`` (the inverse of :func:`module_name`)."""
    folder = max((f for f, package in FOLDERS.items() if within(module, package)), key=lambda f: len(FOLDERS[f]))
    base = REPO / folder / Path(*module.split(".")[len(FOLDERS[folder].split(".")):])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def test_every_declared_command_has_configure_and_help():
    """Each entry point names ``module:configure``, and the module has a one-line ``HELP = "..."``
    (what `medclr --help` shows without importing the module)."""
    from medclr.cli import command_help

    for name, value in declared_commands().items():
        module, _, attr = value.partition(":")
        assert attr == "configure", f"{name}: point the entry point at {module}:configure"
        path = module_file(module)
        assert path.is_file(), f"{name}: {path} missing"
        source = path.read_text()
        assert any(isinstance(n, ast.FunctionDef) and n.name == "configure" for n in ast.parse(source).body), \
            f"{name}: {path} has no configure(parser)"
        assert command_help(source), f"{name}: {path} needs a HELP = \"...\" line"


def test_the_installed_commands_are_the_declared_ones():
    """The entry points register at install: a stale install misses a new command (reinstall:
    ``pip install -e .``)."""
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group=COMMANDS_GROUP)}
    assert installed == declared_commands(), "the installed medclr is stale: run `pip install -e .`"


def test_help_lists_every_command_with_its_help_and_imports_none(tmp_path):
    """`medclr --help` reads each HELP line from the source: no command module, no package above one
    (medclr.io alone costs most of a second) and no torch is imported."""
    import subprocess
    import sys

    from medclr.cli import command_help

    probe = ("import sys\nfrom medclr.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in sys.modules if m.startswith('medclr') or m in ('torch', 'gradio')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    help_text = " ".join(out.stdout.split())  # argparse wraps long lines
    for name, value in declared_commands().items():
        assert f"{name} {command_help(module_file(value.split(':')[0]).read_text())}" in help_text
    assert out.stdout.strip().splitlines()[-1] == "LOADED ['medclr', 'medclr.cli', 'medclr.errors']"


def test_an_unbuilt_or_unregistered_command_is_one_clear_line(monkeypatch, capsys):
    from importlib.metadata import EntryPoint

    import medclr.cli as cli

    registered = cli.commands()
    assert cli.is_built("train") and not cli.is_built("nope")
    ghost = EntryPoint(name="ghost", value="medclr.ghost.cli:configure", group=cli.GROUP)
    monkeypatch.setattr(cli, "commands", lambda: {**registered, "ghost": ghost})
    assert not cli.is_built("ghost")
    assert cli.main(["ghost"]) == 2
    assert capsys.readouterr().err.strip() == "medclr ghost: not built yet in this version"
    monkeypatch.setattr(cli, "commands", dict)  # an install without the entry points
    assert cli.main(["train", "--help"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no subcommands are registered" in err[0] and "pip install" in err[0]
