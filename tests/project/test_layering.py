"""The face depends on the package, never the reverse; nothing outside the lab imports the lab.

The face is what a user runs: the command line (``__main__``, ``_cli`` and its command modules),
the demo and the benchmarks, and the lab's own benchmark entry points (``mamba_edu.lab.bench_*``,
which time a variant with the benchmarks' instrument or measure it at their shapes). The core
(the math, the kernels, serving, the model, the engine, profiling, the exercises) is what they
are made of; no core module may import a face module,
not even inside a function. Read from the source with ``ast``, so nothing is imported.
"""

import ast
from pathlib import Path

import mamba_edu

PACKAGE = Path(mamba_edu.__file__).parent
FACE = ("mamba_edu.__main__", "mamba_edu._cli", "mamba_edu.grading.cli", "mamba_edu._cli_trace",
        "mamba_edu.demo", "mamba_edu.benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path) -> str:
    """The package a file sits in (a package's ``__init__`` is in itself): for relative imports."""
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` imports: ``import x``; ``from x import y`` as ``x`` and ``x.y``
    (relative to ``package`` for ``from .. import``); ``importlib.import_module("x")``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            out.add(node.args[0].value)
    return out


def is_face(name: str) -> bool:
    return (any(name == face or name.startswith(face + ".") for face in FACE)
            or name.startswith("mamba_edu.lab.bench_"))


def test_no_core_module_imports_the_face():
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    assert {"mamba_edu._cli", "mamba_edu._cli_trace", "mamba_edu.grading.cli", "mamba_edu.demo"} <= set(files)
    wrong = {}
    for name, path in files.items():
        if not is_face(name):
            faces = sorted(m for m in imported_modules(path.read_text(), package_of(path)) if is_face(m))
            if faces:
                wrong[name] = faces
    assert not wrong, f"core modules importing the face: {wrong}"


def test_nothing_imports_the_lab():
    """``mamba_edu/lab/`` holds the variants that lost or were never timed: its modules may import
    the package, but no module outside it (and no script or notebook but the appendix, notebook
    10) imports them."""
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    assert "mamba_edu.lab.one_launch" in files
    in_lab = lambda name: name == "mamba_edu.lab" or name.startswith("mamba_edu.lab.")  # noqa: E731
    wrong = {name: sorted(m for m in imported_modules(path.read_text(), package_of(path)) if in_lab(m))
             for name, path in files.items() if not in_lab(name)}
    root = PACKAGE.parent
    for path in sorted((root / "scripts").glob("*.py")):
        wrong[str(path.relative_to(root))] = sorted(
            m for m in imported_modules(path.read_text(), "scripts") if in_lab(m))
    for path in sorted((root / "notebooks").rglob("*.ipynb")):
        if not path.name.startswith("10_") and "mamba_edu.lab" in path.read_text():
            wrong[str(path.relative_to(root))] = ["mamba_edu.lab"]
    wrong = {name: mods for name, mods in wrong.items() if mods}
    assert not wrong, f"modules outside the lab importing it: {wrong}"


def test_the_forward_imports_no_analysis_layer():
    """The forward's layers (kernels, model, serving, the engine) import neither the profiling
    analysis nor the benchmarks that sit above them: the probes they carry live in
    ``mamba_edu.probes``."""
    below = ("mamba_edu.kernels", "mamba_edu.model", "mamba_edu.serving", "mamba_edu.engine",
             "mamba_edu.gdn", "mamba_edu.probes")
    above = ("mamba_edu.profiling", "mamba_edu.benchmarks")
    under = lambda name, roots: any(name == r or name.startswith(r + ".") for r in roots)  # noqa: E731
    wrong = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if under(name, below):
            ups = sorted(m for m in imported_modules(path.read_text(), package_of(path)) if under(m, above))
            if ups:
                wrong[name] = ups
    assert not wrong, f"forward modules importing an analysis layer: {wrong}"


def test_the_import_reader_sees_every_form():
    source = ("import mamba_edu.demo\nfrom mamba_edu import _cli\nfrom .. import benchmarks\n"
              "def f():\n    from mamba_edu._cli import say\n"
              "    importlib.import_module('mamba_edu.__main__')\n")
    found = imported_modules(source, "mamba_edu.profiling")
    assert {"mamba_edu.demo", "mamba_edu._cli", "mamba_edu.benchmarks", "mamba_edu._cli.say",
            "mamba_edu.__main__"} <= found
    assert all(is_face(m) for m in ("mamba_edu.demo", "mamba_edu._cli", "mamba_edu.benchmarks.ttft"))
    assert is_face("mamba_edu.lab.bench_lab_arms")
    assert not any(is_face(m) for m in ("mamba_edu._cli_helpers", "mamba_edu.demos", "mamba_edu.engine",
                                        "mamba_edu.lab.chunk_loop"))


CORE = ("gdn", "kernels", "serving", "model", "engine")  # the course's core (issue 49)


def test_the_core_reads_in_small_pieces():
    """No file of the core over 400 lines, and the Engine class at most 250 (the lean engine's
    targets): a learner reads every line."""
    long = {str(p.relative_to(PACKAGE)): n for part in CORE for p in (PACKAGE / part).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
    tree = ast.parse((PACKAGE / "engine" / "engine.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    assert engine.end_lineno - engine.lineno + 1 <= 250
