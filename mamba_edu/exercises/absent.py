"""Package functions made absent, or metered, for one call of a learner's function.

Both swap a function's code in place for a two-line template that calls a replacement kept in
the function's module globals, so every route to the function changes at once: a reference taken
earlier, a new name, a call from another thread. :func:`absent` makes the functions and torch ops
an exercise forbids raise (the judge opens it around each call of an answer); :func:`metering`
counts the rows of the first argument of every call (a check reads the tokens a scan was given).

A copy is absent too: while the block runs, a profile hook refuses any function whose code equals
a forbidden one's (:func:`fingerprint`), so ``types.FunctionType(f.__code__, …)``, an ``exec`` of
the package's source or a helper that wraps such a copy is named in ``called``. Limits: the hook
watches this thread and the threads started in the block (Python 3.11 has no hook for threads
already running); a copy edited by one constant or name, and a generator copied and resumed from
an instrument, escape; numpy's C functions and ufuncs (``numpy.dot``, ``numpy.matmul``) are
replaced on their module for the block only, so a reference taken before it escapes, while
numpy's Python functions (``numpy.linalg.inv``, ``numpy.cumsum``) are swapped like the package's.
"""

import contextlib
import functools
import inspect
import itertools
import pkgutil
import sys
import threading
import types
import warnings

#: The modules that measure a call while it runs (the sync sniffer, the data-less run, the op
#: recorder). Their methods are never made absent, and their functions run for them alone.
INSTRUMENTS = frozenset({"mamba_edu.profiling.syncs", "mamba_edu.profiling.fake_device",
                         "mamba_edu.exercises.core", "mamba_edu.probes"})

_SLOTS = itertools.count()


def _template(*args, **kwargs):
    return __slot__(*args, **kwargs)  # noqa: F821 - the name is replaced by the swap's own slot


def _loaded(names) -> list:
    """The loaded modules ``(name, module)`` of the top-level packages of the dotted ``names``: read
    once per block (``sys.modules`` holds thousands), so each forbidden package looks only there."""
    roots = tuple({n.partition(".")[0] for n in names})
    prefixes = tuple(root + "." for root in roots)
    return [(name, m) for name, m in list(sys.modules.items())
            if m is not None and (name in roots or name.startswith(prefixes))]


def _functions(obj, loaded: list) -> list:
    """The Python functions behind a name: a function, the methods of a class, every function and
    method of a loaded module or package (``loaded``: :func:`_loaded`). Closures are left out
    (their code cannot be swapped), and so are Triton kernels (the interpreter runs them from
    their source)."""
    obj = getattr(obj, "__wrapped__", obj)
    if isinstance(obj, (types.MethodType, classmethod, staticmethod)):
        return _functions(obj.__func__, loaded)
    if isinstance(obj, types.FunctionType):
        return [] if obj.__code__.co_freevars else [obj]
    if isinstance(obj, type):
        return [f for member in vars(obj).values() if isinstance(member, (types.FunctionType, classmethod, staticmethod))
                for f in _functions(member, loaded)]
    if isinstance(obj, types.ModuleType):
        base, package = obj.__name__, hasattr(obj, "__path__")
        modules = [m for name, m in loaded if name == base or (package and name.startswith(base + "."))]
        return [f for module in modules for member in list(vars(module).values())
                if getattr(member, "__module__", None) == module.__name__ for f in _functions(member, loaded)]
    return []


def _swap(function, make) -> tuple:
    """Route every call of ``function`` to ``make(original)``, where ``original`` runs the old code.
    Returns what :func:`_restore` needs to put it back."""
    code = function.__code__
    original = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__)
    original.__kwdefaults__ = function.__kwdefaults__
    slot = f"__mamba_edu_swap_{next(_SLOTS)}__"
    function.__globals__[slot] = make(original)
    function.__code__ = _template.__code__.replace(
        co_names=(slot,), co_name=code.co_name, co_qualname=code.co_qualname,
        co_filename=code.co_filename, co_firstlineno=code.co_firstlineno)
    return function, code, slot


def _restore(swapped: list) -> None:
    for function, code, slot in reversed(swapped):  # the last swap first: a function swapped twice
        function.__code__ = code
        function.__globals__.pop(slot, None)


class _Raiser:
    """What a forbidden function becomes (``make`` for :func:`_swap`, with ``dotted`` and ``called``
    bound): a call records ``dotted`` in ``called`` and raises; a function of an instrument called
    by an instrument (the sniffer's helpers, during the answer) still runs."""

    def __init__(self, dotted: str, called: list, original):
        self.dotted, self.called, self.original = dotted, called, original
        self.instrument = getattr(original, "__module__", None) in INSTRUMENTS

    def __call__(self, *args, **kwargs):
        if self.instrument and sys._getframe(2).f_globals.get("__name__") in INSTRUMENTS:
            return self.original(*args, **kwargs)
        self.called.append(self.dotted)
        raise RuntimeError(f"{self.dotted} is not available in this exercise: write it yourself")


def fingerprint(code: types.CodeType) -> tuple:
    """What makes two code objects the same function whatever their name, file or lines: the
    bytecode, the constants (a nested function's code by its own fingerprint) and the names read."""
    consts = tuple(fingerprint(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.co_code, consts, code.co_names


_REFUSED = {}  # id(code) -> (code, its fingerprint or None), for the forbidden functions: read once


def _refused_fingerprint(f) -> tuple | None:
    """The fingerprint of ``f``'s code if copies of it are refused, else None: it is written in its
    module's own file (not generated, as a dataclass's ``__init__``, nor borrowed from another
    module) and its body has two lines or more (copying a one-line helper is no more than writing
    that line; and ``pass``, ``self.x = x`` or ``(a + b - 1) // b`` are in many libraries)."""
    code = f.__code__
    if id(code) not in _REFUSED:
        lines = {line for *_, line in code.co_lines() if line is not None}
        own = code.co_filename == getattr(sys.modules.get(f.__module__), "__file__", None)
        _REFUSED[id(code)] = code, fingerprint(code) if own and len(lines) > 2 else None
    return _REFUSED[id(code)][1]


def _copies_refused(fingerprints: dict, called: list):
    """A profile hook: a call of code whose fingerprint is in ``fingerprints`` (→ dotted) appends
    ``"<dotted> (a copy)"`` to ``called`` (a profile hook cannot raise into the answer; the judge
    fails it on ``called``), unless it comes from a :class:`_Raiser` letting an instrument through
    or from an instrument itself (the sniffer resuming its own generators)."""
    verdicts = {}  # id(code) -> (code, dotted or None): the code kept alive so that no id is reused

    def hook(frame, event, arg):
        if event != "call":
            return
        code, caller = frame.f_code, frame.f_back
        known = verdicts.get(id(code))
        if known is None:
            known = verdicts[id(code)] = (code, fingerprints.get(fingerprint(code)))
        if known[1] and (caller is None or (caller.f_code is not _Raiser.__call__.__code__
                                            and caller.f_globals.get("__name__") not in INSTRUMENTS)):
            called.append(f"{known[1]} (a copy)")
    return hook


@contextlib.contextmanager
def _watching(hook, called: list):
    """``hook`` profiles this thread and every thread started in the block; removing it there
    (``sys.setprofile(None)``) is recorded in ``called`` as a call of ``sys.setprofile``."""
    before = sys.getprofile(), threading.getprofile()
    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        yield
    finally:
        if (sys.getprofile(), threading.getprofile()) != (hook, hook):
            called.append("sys.setprofile (the judge's hook)")
        sys.setprofile(before[0])
        threading.setprofile(before[1])


def _aten_ops(obj, dotted: str) -> dict:
    """The aten ops behind a forbidden torch name (``op name → dotted``): a builtin such as
    ``torch.inverse``, or every builtin of a module such as ``torch.linalg`` (its
    ``solve_triangular`` is ``aten::linalg_solve_triangular``)."""
    import torch

    if dotted.split(".")[0] != "torch":
        return {}
    members = list(vars(obj).values()) if isinstance(obj, types.ModuleType) else [obj]
    return {f.__name__: dotted for f in members if isinstance(f, (types.BuiltinFunctionType, types.MethodDescriptorType))
            and getattr(torch.ops.aten, f.__name__, None) is not None}


def _ops_absent(ops: dict, called: list):
    """Register, over the CPU and CUDA kernels of every aten op of ``ops``, one that records the
    call and raises: the dispatcher serves every thread and route (``torch.linalg``, a method,
    ``torch.ops.aten``). Returns the registrations, to destroy afterwards (None without ops)."""
    import torch

    if not ops:
        return None

    def raiser(op: str):
        def absent_op(*args, **kwargs):
            called.append(f"{ops[op]} ({op})")
            raise RuntimeError(f"{op} is not available in this exercise: write it yourself")
        return absent_op

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        for op in ops:
            for key in ("CPU", "CUDA"):
                library.impl(op, raiser(op), key)
    return library


def _replaced(parent, name: str, dotted: str, called: list) -> tuple:
    """Put a :class:`_Raiser` in place of the C function ``parent.name`` (a numpy builtin or ufunc,
    whose code cannot be swapped); returns what :func:`_put_back` needs."""
    original = getattr(parent, name)
    setattr(parent, name, _Raiser(dotted, called, original))
    return parent, name, original


@contextlib.contextmanager
def absent(forbidden):
    """``with absent(dotted_names) as called:`` in the block, every package function and torch op
    behind the names raises, so do numpy's, and so does a copy of one of those package functions;
    ``called`` lists those that were called. The methods of the instruments stay (they run during
    the call)."""
    called, functions, ops, replaced, loaded = [], {}, {}, [], _loaded(forbidden)
    for dotted in forbidden:
        try:
            obj = pkgutil.resolve_name(dotted)
        except (ImportError, AttributeError):  # a name this version does not have cannot be called
            continue
        named_ops = _aten_ops(obj, dotted)
        ops.update(named_ops)
        found = [f for f in _functions(obj, loaded) if not (f.__module__ in INSTRUMENTS and "." in f.__qualname__)]
        for f in found:
            functions.setdefault(f, dotted)
        if not (found or named_ops) and callable(obj) and not isinstance(obj, type) and "." in dotted:
            parent, _, name = dotted.rpartition(".")
            replaced.append(_replaced(pkgutil.resolve_name(parent), name, dotted, called))
    fingerprints = {}
    for f, dotted in functions.items():  # before the swap, which changes the code
        if (key := _refused_fingerprint(f)) is not None:
            fingerprints.setdefault(key, dotted)
    swapped = [_swap(f, functools.partial(_Raiser, dotted, called)) for f, dotted in functions.items()]
    library = _ops_absent(ops, called)
    try:
        with _watching(_copies_refused(fingerprints, called), called):
            yield called
    finally:
        _restore(swapped)
        for parent, name, original in replaced:
            setattr(parent, name, original)
        if library is not None:
            library._destroy()


def _counter(rows: list):
    """``make`` for :func:`_swap`: a call appends the rows of its first argument to ``rows``."""
    def make(original):
        first = next(iter(inspect.signature(original).parameters))

        def counted(*args, **kwargs):
            x = args[0] if args else kwargs.get(first)
            rows.append(len(x) if hasattr(x, "__len__") else 0)
            return original(*args, **kwargs)
        return counted
    return make


@contextlib.contextmanager
def metering(names):
    """``with metering(dotted_names) as rows:`` every call of the functions behind the names, from
    any thread, appends the rows of its first argument (a packed ``[T, …]`` input: its tokens)."""
    rows = []
    loaded = _loaded(names)
    swapped = [_swap(f, _counter(rows)) for name in names for f in _functions(pkgutil.resolve_name(name), loaded)]
    try:
        yield rows
    finally:
        _restore(swapped)
