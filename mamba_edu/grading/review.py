"""What the checks cannot judge: a static scan that flags the cells an instructor should read.

:func:`review_flags` names, by cell and line, every use of the routes ``docs/teaching.md`` lists
as flagged. Names assembled from strings or reached through an allowed object defeat it: it
flags, it does not prove. Nothing here imports torch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """One suspicious line: ``cell`` and ``line`` count from 1 (code cells only)."""

    cell: int
    line: int
    reason: str
    text: str


THREADS = "uses threads or processes"
RAW_MEMORY = "uses ctypes, cffi or mmap"
FRAMES = "inspects frames or memory"
CODE = "builds code at run time"
TORCH_MODES = "switches torch's modes"
FILES = "opens a file outside its folder or by a computed path"
OUTPUT = "writes to the output or a file descriptor"
PATCH = "patches the package, torch or numpy"
DYNAMIC = "uses dynamic attribute access"
MAGIC = "runs a shell command or an unusual magic"
UNPARSED = "could not be parsed"

#: Imported names (a module, or one of its members) and the reason their use is flagged.
MODULES = {name: reason for reason, names in (
    (THREADS, "threading _thread concurrent.futures multiprocessing asyncio subprocess signal os.fork os.forkpty "
              "os.system os.popen os.kill os.killpg os.posix_spawn os.execv os.execve os.spawnv pty"),
    (RAW_MEMORY, "ctypes cffi mmap"),
    (FRAMES, "sys._getframe sys._current_frames sys.settrace sys.setprofile sys.modules gc traceback "
             "inspect.currentframe logging.currentframe "
             "inspect.stack inspect.trace inspect.getouterframes inspect.getinnerframes "
             "inspect.getclosurevars inspect.getgeneratorlocals"),
    (CODE, "importlib types.FunctionType types.CodeType types.LambdaType runpy marshal builtins unittest.mock"),
    (TORCH_MODES, "torch._C torch.library torch.utils._python_dispatch torch.overrides"),
    (OUTPUT, "sys.stdout sys.stderr sys.__stdout__ sys.__stderr__ os.write os.dup os.dup2 os.fdopen os.open "
             "os.pipe"),
    (FILES, "os.remove os.unlink os.rename os.replace os.rmdir os.removedirs os.symlink os.link os.chmod "
            "os.truncate os.listdir os.scandir os.walk os.chdir glob")) for name in names.split()}
#: Attribute or member names flagged wherever they appear.
ANYWHERE = {name: reason for reason, names in (
    (FRAMES, "_getframe f_back f_locals f_globals f_code tb_frame gi_frame cr_frame __code__ __globals__ "
             "__closure__ __builtins__"),
    (CODE, "__import__"),
    (TORCH_MODES, "TorchDispatchMode TorchFunctionMode _disable_current_modes _DisableTorchDispatch "
                  "set_sync_debug_mode")) for name in names.split()}
BUILTINS = {"exec": CODE, "eval": CODE, "compile": CODE, "__import__": CODE, "breakpoint": FRAMES}
PATH_WRITES = {"write_text", "write_bytes", "unlink", "touch", "symlink_to", "hardlink_to", "rmdir"}
#: Magics that leave the rest of the line, or of the cell, plain Python.
PYTHON_MAGICS = {"matplotlib", "time", "timeit", "config", "load_ext", "autoreload", "precision"}


def _prepare(source: str) -> tuple[str, list[int]]:
    """The cell with IPython's magics, shell and help lines commented out (lines kept), and the
    lines of a magic not in :data:`PYTHON_MAGICS` or a ``!`` shell command."""
    lines, odd = source.splitlines(), []
    for i, line in enumerate(lines):
        bare = line.lstrip()
        if bare[:1] in ("%", "!", "?") or bare.endswith("?"):
            name = bare.lstrip("%").split(" ")[0]
            if bare[:1] == "!" or (bare[:1] == "%" and name not in PYTHON_MAGICS):
                odd.append(i + 1)
            if bare.startswith("%%") and name not in PYTHON_MAGICS:  # the cell's body is not Python
                return "", odd
            lines[i] = line[: len(line) - len(bare)] + "# " + bare
    return "\n".join(lines), odd


def _aliases(trees) -> dict[str, str]:
    """``local name → dotted name`` of every import of the notebook, whatever its cell, and of every
    name assigned one of them (``L = torch.linalg``, also in a chain)."""
    names, nodes = {}, [node for tree in trees for node in ast.walk(tree)]
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    assigned = [(t.id, node.value) for node in nodes if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)]
    for _ in range(3):  # a chain of assignments, in any order of the cells
        names.update({name: dotted for name, value in assigned if name not in names
                      and (dotted := _dotted(value, names))})
    return names


def _dotted(node, aliases: dict) -> str:
    """``a.b.c`` for an attribute chain whose head is an imported name, else ``""``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return ""
    return ".".join([aliases[node.id], *reversed(parts)])


def _named(dotted: str) -> str | None:
    """The reason a dotted name is flagged (:data:`MODULES`, :data:`ANYWHERE`), or None."""
    for prefix, reason in MODULES.items():
        if dotted == prefix or dotted.startswith(prefix if prefix.endswith("_") else prefix + "."):
            return reason
    return next((ANYWHERE[p] for p in dotted.split(".") if p in ANYWHERE), None)


def _patches(dotted: str) -> bool:
    """Whether assigning ``dotted`` patches the package, torch or numpy (torch's settings,
    ``torch.backends``, aside)."""
    return dotted.startswith(("mamba_edu.", "torch.", "numpy.")) and not dotted.startswith("torch.backends.")


def _literal(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _safe_path(node) -> bool:
    """A plain relative string literal that stays inside the notebook's folder."""
    if not _literal(node):
        return False
    path = node.value.replace("\\", "/")
    return not path.startswith(("/", "~")) and ":" not in path and ".." not in path.split("/")


def _call_reason(node: ast.Call, aliases: dict) -> str | None:
    """The reason to flag a call by what it calls and with what: a file opened by a path that is
    not :func:`_safe_path`, ``getattr``/``setattr`` with a computed name or on the package."""
    func, args = node.func, node.args
    name = func.id if isinstance(func, ast.Name) and func.id not in aliases else None
    dotted = _dotted(func, aliases)
    if name in ("getattr", "setattr", "delattr", "hasattr") and len(args) > 1:
        target = _dotted(args[0], aliases)
        if name in ("setattr", "delattr") and (target == "mamba_edu" or _patches(target + ".")):
            return PATCH
        return None if _literal(args[1]) else DYNAMIC
    if name == "vars" and args and _dotted(args[0], aliases):
        return FRAMES
    if name == "open" or dotted in ("io.open", "pathlib.Path.open", "codecs.open"):
        return None if args and _safe_path(args[0]) else FILES
    if dotted.startswith("shutil."):
        return None if args and all(map(_safe_path, args)) else FILES
    if isinstance(func, ast.Attribute) and func.attr in PATH_WRITES:
        path = func.value  # safe only as pathlib.Path('relative/literal')
        literal = isinstance(path, ast.Call) and _dotted(path.func, aliases).startswith("pathlib.")
        return None if literal and path.args and _safe_path(path.args[0]) else FILES
    return BUILTINS.get(name)


#: How the names of frame, traceback and code attributes start (``f_back``, ``tb_frame``, ``co_code``).
FRAME_PREFIXES = ("f_", "tb_", "gi_", "cr_", "co_")


def _dunder_built(node) -> bool:
    """A string built at run time that spells a dunder or a frame attribute (``'__' + name``,
    ``f"__{x}__"``, ``'f_' + 'back'``)."""
    def spells(part) -> bool:
        return _literal(part) and ("__" in part.value or part.value.startswith(FRAME_PREFIXES))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return spells(node.left) or spells(node.right)
    return isinstance(node, ast.JoinedStr) and any(map(spells, node.values))


def _reasons(tree, aliases: dict):
    """``(line, reason)`` for every flagged node of one cell's syntax tree."""
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = f"{node.module}." if getattr(node, "module", None) else ""
            yield from ((line, r) for a in node.names if (r := _named(module + a.name)))
        elif isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node, aliases)  # an imported name's, else a bare name or attribute
            if reason := _named(dotted) if dotted else ANYWHERE.get(getattr(node, "attr", None) or node.id):
                yield line, reason
            if isinstance(node, ast.Attribute) and node.attr == "__dict__" and _dotted(node.value, aliases):
                yield line, FRAMES
        elif isinstance(node, ast.Call) and (reason := _call_reason(node, aliases)):
            yield line, reason
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = [_dotted(t, aliases) for t in getattr(node, "targets", None) or [node.target]
                       if isinstance(t, ast.Attribute)]  # `dtype = torch.bfloat16` patches nothing
            if any(map(_patches, targets)):
                yield line, PATCH
        elif _dunder_built(node):
            yield line, DYNAMIC
        elif _literal(node) and node.value.startswith(("/proc/", "/dev/")):
            yield line, FILES
        elif _literal(node) and node.value in ANYWHERE:  # getattr(f, "f_back"), attrgetter("f_locals")
            yield line, ANYWHERE[node.value]


def review_flags(cells: list[str]) -> list[Flag]:
    """The flags of a notebook's code cells (their sources, in order), one per cell, line and
    reason, in the order of the cells and lines."""
    prepared = [_prepare(source) for source in cells]
    trees = []
    for source, _ in prepared:
        try:
            trees.append(ast.parse(source))
        except SyntaxError:  # also null bytes, in Python 3.11
            trees.append(None)
    aliases = _aliases(t for t in trees if t is not None)
    flags = set()
    for number, (source, (_, odd), tree) in enumerate(zip(cells, prepared, trees), 1):
        lines = source.splitlines() or [""]
        found = {(n, MAGIC) for n in odd} | (set(_reasons(tree, aliases)) if tree else {(1, UNPARSED)})
        flags |= {Flag(number, n, reason, lines[min(n, len(lines)) - 1].strip()[:120]) for n, reason in found}
    return sorted(flags, key=lambda f: (f.cell, f.line, f.reason))


def summary(flags: list[Flag], limit: int = 400) -> str:
    """One line, at most about ``limit`` characters: ``needs review: cell 3 line 2 uses threads or
    processes (threading.Thread(...)); …``, or ``""`` without flags."""
    if not flags:
        return ""
    line = "needs review:"
    for shown, f in enumerate(flags):
        item = f" cell {f.cell} line {f.line} {f.reason} ({f.text[:60]});"
        if len(line) + len(item) > limit:
            return f"{line} … and {len(flags) - shown} more"
        line += item
    return line.rstrip(";")
