"""The face depends on the package, never the reverse.

The face is what a user runs: the command line (``__main__``, ``_cli`` and its command modules),
the demo and the benchmarks. The core (the math, the kernels, serving, the model, the engine,
profiling, the exercises) is what they are made of; no core module may import a face module,
not even inside a function. Read from the source with ``ast``, so nothing is imported.
"""

import ast
from pathlib import Path

import mamba_edu

PACKAGE = Path(mamba_edu.__file__).parent
FACE = ("mamba_edu.__main__", "mamba_edu._cli", "mamba_edu._cli_grade", "mamba_edu._cli_trace",
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
    return any(name == face or name.startswith(face + ".") for face in FACE)


def test_no_core_module_imports_the_face():
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    assert {"mamba_edu._cli", "mamba_edu._cli_trace", "mamba_edu._cli_grade", "mamba_edu.demo"} <= set(files)
    wrong = {}
    for name, path in files.items():
        if not is_face(name):
            faces = sorted(m for m in imported_modules(path.read_text(), package_of(path)) if is_face(m))
            if faces:
                wrong[name] = faces
    assert not wrong, f"core modules importing the face: {wrong}"


def test_the_import_reader_sees_every_form():
    source = ("import mamba_edu.demo\nfrom mamba_edu import _cli\nfrom .. import benchmarks\n"
              "def f():\n    from mamba_edu._cli import say\n"
              "    importlib.import_module('mamba_edu.__main__')\n")
    found = imported_modules(source, "mamba_edu.profiling")
    assert {"mamba_edu.demo", "mamba_edu._cli", "mamba_edu.benchmarks", "mamba_edu._cli.say",
            "mamba_edu.__main__"} <= found
    assert all(is_face(m) for m in ("mamba_edu.demo", "mamba_edu._cli", "mamba_edu.benchmarks.ttft"))
    assert not any(is_face(m) for m in ("mamba_edu._cli_helpers", "mamba_edu.demos", "mamba_edu.engine"))
