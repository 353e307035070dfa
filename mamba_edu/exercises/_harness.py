"""The grader's agent inside the learner's kernel (see :mod:`mamba_edu.exercises.remote`).

The grader does not use the kernel's copy of this file (a check the notebook runs itself borrows
:func:`metering` from it): it reads its source once, before any notebook runs, and sends it with
every request, so patching the package inside the kernel does not change it. A request (a file
the grader writes, ``torch.save``) names one of the notebook's functions and its inputs;
:func:`serve` calls it under the instruments the grader asks for and writes a reply
(``torch.save``) that the grader reads with ``torch.load(weights_only=True)``: plain tensors,
numbers, strings, lists, tuples and dicts only. The grader computes every reference and verdict
in its own process; what comes back from here is the learner's answer and what was measured
while it ran (would-be syncs, aten ops, calls of forbidden functions, Triton launches, the
tokens of metered scans). For the call, forbidden package functions and the aten ops of forbidden
torch functions are absent in every thread.
"""

import contextlib
import hashlib
import inspect
import io
import os
import sys
import traceback
import types


def code_digest(code) -> str:
    """A digest of a code object: bytecode, names and constants, nested code included."""
    h = hashlib.sha256(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        h.update(code_digest(const).encode() if isinstance(const, types.CodeType) else repr(const).encode())
    return h.hexdigest()


def module_digests(namespace: dict, module_name: str) -> dict:
    """``qualname -> digest`` of every function (and method of every class) a module defines."""
    out = {}
    for name, obj in namespace.items():
        if isinstance(obj, types.FunctionType) and obj.__module__ == module_name:
            out[name] = code_digest(obj.__code__)
        elif isinstance(obj, type) and obj.__module__ == module_name:
            for attr, member in vars(obj).items():
                if isinstance(member, types.FunctionType):
                    out[f"{name}.{attr}"] = code_digest(member.__code__)
    return out


def _resolve(dotted: str):
    """The object at ``package.module.attr[.attr]`` (the longest importable module prefix)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _functions(obj) -> list:
    """The functions behind a forbidden name: a function, the methods of a class, every function
    of a module; a Triton kernel's Python function too (the interpreter recompiles it)."""
    obj = getattr(obj, "__wrapped__", obj)
    if isinstance(obj, types.FunctionType):
        return [obj]
    if isinstance(getattr(obj, "fn", None), types.FunctionType) and not isinstance(obj, (type, types.ModuleType)):
        return [obj.fn]  # a Triton kernel or @triton.jit helper
    if isinstance(obj, types.MethodType):
        return _functions(obj.__func__)
    if isinstance(obj, type):
        return [f for member in vars(obj).values() for f in _functions(member)
                if isinstance(member, (types.FunctionType, classmethod, staticmethod))]
    if isinstance(obj, (classmethod, staticmethod)):
        return _functions(obj.__func__)
    if isinstance(obj, types.ModuleType):  # a package: every module of it that is loaded
        modules = [m for name, m in list(sys.modules.items()) if m is not None and (
            name == obj.__name__ or (hasattr(obj, "__path__") and name.startswith(obj.__name__ + ".")))]
        return [f for module in modules for member in list(vars(module).values())
                if module.__name__ in (getattr(member, "__module__", None),  # or a Triton kernel's function's
                                       getattr(getattr(member, "fn", None), "__module__", None))
                for f in _functions(member)]
    return []


#: Modules the harness itself runs during the call (the sniffer, the data-less run, the memory
#: record): never made absent; an answer that calls them is still refused by the call tracer.
_INSTRUMENTS = frozenset({"mamba_edu.profiling.syncs", "mamba_edu.profiling.fake_device",
                          "mamba_edu.exercises.core", "mamba_edu.probes"})


def _absent_template(*args, **kwargs):
    raise RuntimeError("this function is not available in this exercise: write it yourself")


def _make_absent(functions: dict, codes: dict) -> list:
    """Swap the code of every plain function of ``functions`` (function → its forbidden dotted
    name) for one that raises, so that a forbidden function is absent for the call, however it
    is reached (a reference taken earlier, a new name, a worker thread). Returns
    ``[(function, original code)]`` for :func:`_restore`; each raising code joins ``codes`` (code
    → name) under the same name, so that the call tracer still names it."""
    swapped = []
    for function, dotted in functions.items():
        code = function.__code__
        if code.co_freevars or function.__module__ in _INSTRUMENTS:
            continue  # a closure's code cannot be swapped; the instruments run during the call
        raiser = _absent_template.__code__.replace(
            co_name=code.co_name, co_qualname=code.co_qualname, co_filename=code.co_filename,
            co_firstlineno=code.co_firstlineno)
        swapped.append((function, code))
        function.__code__ = raiser
        codes[raiser] = dotted
    return swapped


def _aten_ops(obj, dotted: str) -> dict:
    """The aten ops behind a forbidden torch name (``op name → dotted``): a builtin such as
    ``torch.inverse``, or every builtin of a module such as ``torch.linalg`` (its
    ``solve_triangular`` is ``aten::linalg_solve_triangular``)."""
    import torch

    if dotted.split(".")[0] != "torch":
        return {}
    builtins = (types.BuiltinFunctionType, types.MethodDescriptorType)
    members = list(vars(obj).values()) if isinstance(obj, types.ModuleType) else [obj]
    return {f.__name__: dotted for f in members
            if isinstance(f, builtins) and getattr(torch.ops.aten, f.__name__, None) is not None}


def _make_ops_absent(ops: dict, seen: list):
    """Register, over the CPU and CUDA kernels of every aten op of ``ops`` (op name → forbidden
    dotted name), one that records the call in ``seen`` and raises. The dispatcher serves every
    thread and every route (``torch.linalg``, a method, ``torch.ops.aten``, a reference taken
    earlier), so the op is absent for the call; :func:`_restore` puts the kernels back. Returns
    the registrations (``None`` without ops)."""
    import warnings

    import torch

    if not ops:
        return None

    def absent(op: str):
        def raiser(*args, **kwargs):
            seen.append(f"{ops[op]} ({op})")
            raise RuntimeError(f"{op} is not available in this exercise: write it yourself")
        return raiser

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        for op in ops:
            for key in ("CPU", "CUDA"):
                library.impl(op, absent(op), key)
    return library


#: The keyword argument through which a check asks for calls of package functions (dotted names)
#: to be metered (:func:`meter`); the answer never sees it.
METERED = "_mamba_edu_metered"

#: The global through which a metered function's code reaches its counter; the template's one name.
_METER_SLOT = "__mamba_edu_meter__"


def _slot(function) -> str:
    return f"{_METER_SLOT}{id(function)}"


def _metered_template(*args, **kwargs):
    return __mamba_edu_meter__(*args, **kwargs)  # noqa: F821 - set in the metered function's globals


def _meter(functions: list, rows: list) -> list:
    """Swap the code of every plain function of ``functions`` for one that appends the number of
    rows of its first argument (the tokens of a packed ``[T, …]`` input) to ``rows``, then runs
    the original: every call counts, whatever thread or name made it. Returns
    ``[(function, original code)]`` for :func:`_restore`."""
    swapped = []
    for function in functions:
        code = function.__code__
        if code.co_freevars:
            continue  # a closure's code cannot be swapped
        original = types.FunctionType(code, function.__globals__, function.__name__,
                                      function.__defaults__, function.__closure__)
        original.__kwdefaults__ = function.__kwdefaults__
        first = next(iter(inspect.signature(original).parameters))

        def counted(*args, _original=original, _first=first, **kwargs):
            x = args[0] if args else kwargs.get(_first)
            rows.append(len(x) if hasattr(x, "__len__") else 0)
            return _original(*args, **kwargs)

        function.__globals__[_slot(function)] = counted
        swapped.append((function, code))
        function.__code__ = _metered_template.__code__.replace(
            co_names=(_slot(function),), co_name=code.co_name, co_qualname=code.co_qualname,
            co_filename=code.co_filename, co_firstlineno=code.co_firstlineno)
    return swapped


def meter(names) -> tuple[list, list]:
    """``(swapped, rows)``: every function behind the dotted ``names`` metered (:func:`_meter`)
    until ``_restore(swapped)``; ``rows`` fills with one entry per call."""
    rows = []
    return _meter([f for name in names for f in _functions(_resolve(name))], rows), rows


@contextlib.contextmanager
def metering(names):
    """``with metering(names) as rows:`` :func:`meter` for the block."""
    swapped, rows = meter(names)
    try:
        yield rows
    finally:
        _restore(swapped)


def _restore(swapped: list, library=None) -> None:
    """Put back the codes of :func:`_make_absent` and :func:`_meter`, and the kernels of
    :func:`_make_ops_absent`."""
    for function, code in reversed(swapped):  # last swapped first: a metered absent function too
        function.__code__ = code
        function.__globals__.pop(_slot(function), None)
    if library is not None:
        library._destroy()


def _cell_dir() -> str:
    try:
        from ipykernel.compiler import get_tmp_directory
        return get_tmp_directory()
    except Exception:  # not in ipykernel (the tests run serve() directly)
        return "\0"


def _library_roots(folder: str, site_only: bool = False) -> tuple:
    """Where code may come from: the installed libraries, the package, and (unless ``site_only``)
    the notebook's folder."""
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    import mamba_edu
    roots.add(os.path.dirname(os.path.abspath(mamba_edu.__file__)))
    if not site_only:
        roots.add(folder)
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots)


def _definition(fn) -> tuple:
    """``(function, source)`` of the Python function behind an answer (a Triton kernel's ``fn``)."""
    inner = getattr(fn, "fn", fn)
    if not isinstance(inner, types.FunctionType):
        return None, None
    try:
        source = inspect.getsource(inner)
    except (OSError, TypeError):
        source = None
    return inner, source


def _describe(fn, name: str, request: dict) -> dict:
    """What kind of answer ``fn`` is, and whether it may be graded at all."""
    import mamba_edu

    package = os.path.join(os.path.dirname(os.path.abspath(mamba_edu.__file__)), "")
    kind = "function"
    try:
        import triton
        from triton.runtime.jit import JITFunction, KernelInterface
        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:
            InterpretedFunction = JITFunction
        triton_dir = os.path.join(os.path.dirname(os.path.abspath(triton.__file__)), "")
        if isinstance(fn, KernelInterface):
            if type(fn) not in (JITFunction, InterpretedFunction):
                return {"refused": f"{name} is a {type(fn).__name__}, a stand-in for a Triton kernel, "
                                   "not a kernel made by @triton.jit"}
            for method in ("__getitem__", "run"):
                code = getattr(getattr(type(fn), method), "__code__", None)
                if code is None or not os.path.abspath(code.co_filename).startswith(triton_dir):
                    return {"refused": f"Triton's {type(fn).__name__}.{method} was replaced in the kernel"}
            kind = "triton"
    except ImportError:
        pass
    module = getattr(fn, "__module__", None) or ""
    inner, source = _definition(fn)
    if module.startswith("mamba_edu") or (inner is not None and os.path.abspath(
            inner.__code__.co_filename).startswith(package)):
        where = f"{module}.{getattr(fn, '__qualname__', name)}"
        return {"refused": f"{name} is the package's own {where}, not an answer written in the notebook"}
    if inner is None:
        return {"refused": f"{name} is a {type(fn).__name__}, not a function defined in the notebook"}
    if os.path.dirname(os.path.abspath(inner.__code__.co_filename)) != os.path.abspath(request["cell_dir"]):
        return {"refused": f"{name} was not defined in a cell of the notebook (its code comes from "
                           f"{inner.__code__.co_filename})"}
    return {"kind": kind, "source": source or ""}


def _plain(value, depth=0):
    """Raise TypeError unless ``value`` is plain data the grader accepts back."""
    import torch

    if depth > 20:
        raise TypeError("nested too deep")
    if value is None or type(value) in (bool, int, float, str):
        return
    if type(value) is torch.Tensor:
        if value.is_sparse or value.layout != torch.strided:
            raise TypeError(f"a {value.layout} tensor")
        return
    if type(value) in (tuple, list):
        for v in value:
            _plain(v, depth + 1)
        return
    if type(value) is dict:
        for k, v in value.items():
            if type(k) not in (str, int):
                raise TypeError(f"a dict key of type {type(k).__name__}")
            _plain(v, depth + 1)
        return
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__}")


def _plain_copy(value):
    """Tensors detached, contiguous and on the CPU (the grader moves them back)."""
    if type(value).__name__ == "Tensor":
        return value.detach().to("cpu", copy=True).contiguous()
    if isinstance(value, (tuple, list)):
        return type(value)(_plain_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain_copy(v) for k, v in value.items()}
    return value


def _not_done(err) -> bool:
    while err is not None:
        if isinstance(err, NotImplementedError) or "NotImplementedError" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _load_fresh(path: str, name: str):
    """A module loaded from its file, not from ``sys.modules`` (which the notebook may have patched)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_mamba_edu_grader_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve(request_path: str, reply_path: str, own_file: str) -> None:
    """Answer one request of the grader (see the module's docstring)."""
    import torch

    reply = {}
    try:
        with open(request_path, "rb") as f:
            request = torch.load(f, weights_only=False)
        reply = _serve(request, own_file)
    except BaseException as err:  # noqa: BLE001 - everything the learner's code raises is reported
        reply = {"error": {"type": type(err).__name__, "message": str(err)[:2000],
                           "not_done": _not_done(err), "base": not isinstance(err, Exception),
                           "where": _where(err)}}
    buffer = io.BytesIO()
    try:
        _plain(reply)
    except TypeError as err:
        reply = {"refused": f"the answer returned {err}; expected plain torch.Tensor, numbers, "
                            "strings, lists, tuples or dicts"}
    torch.save(reply, buffer)
    tmp = reply_path + ".part"
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
    os.replace(tmp, reply_path)


def _where(err) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return f"line {frames[-1].lineno} of {frames[-1].name}" if frames else ""


def _serve(request: dict, own_file: str) -> dict:
    import torch

    ip = sys.modules.get("IPython")
    shell = ip.get_ipython() if ip is not None else None
    namespace = shell.user_ns if shell is not None else request.get("namespace", {})
    name = request["name"]
    if name not in namespace:
        return {"missing": True}
    fn = namespace[name]
    request.setdefault("cell_dir", _cell_dir())
    description = _describe(fn, name, request)
    if request["mode"] == "describe" or "refused" in description:
        return description
    # the instruments: the package's sniffer, checked against the grader's copy of its code
    for module_name, expected in request["integrity"].items():
        module = sys.modules.get(module_name)
        if module is None:
            __import__(module_name)
            module = sys.modules[module_name]
        if module_digests(vars(module), module_name) != expected:
            return {"refused": f"the notebook changed {module_name} in its kernel: the grader's "
                               "instruments cannot be trusted, so the answer is not graded"}
    from mamba_edu.profiling.syncs import count_syncs
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            self.ops.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    forbidden, functions, ops = {}, {}, {}
    for dotted in request["forbidden"]:
        try:
            obj = _resolve(dotted)
        except Exception:  # noqa: BLE001 - a name this version does not have cannot be called
            continue
        found = _functions(obj)
        for f in found:
            forbidden[f.__code__] = dotted
        # A Triton kernel's function stays: its interpreter recompiles it from the source
        functions.update((f, dotted) for f in found
                         if getattr(f.__globals__.get(f.__name__), "fn", None) is not f)
        ops.update(_aten_ops(obj, dotted))
    # Triton's interpreter runs a recompiled copy of a @triton.jit function (same file and name)
    forbidden_by_name = {(code.co_filename, code.co_name): dotted for code, dotted in forbidden.items()
                         if not code.co_filename.startswith("<")}
    roots = _library_roots(os.path.abspath(os.getcwd()))
    libraries = _library_roots("", site_only=True)  # whose exec'd helpers (namedtuple, dataclasses) run
    cell_dir = os.path.join(os.path.abspath(request["cell_dir"]), "")
    seen_forbidden, foreign, cell_code, seen = [], [], [], set()

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in seen:
            return
        seen.add(code)
        if code in forbidden or (code.co_filename, code.co_name) in forbidden_by_name:
            seen_forbidden.append(forbidden.get(code) or forbidden_by_name[(code.co_filename, code.co_name)])
            return
        filename = code.co_filename
        if filename == own_file:
            return
        if filename.startswith("<"):  # exec'd or generated code
            caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
            if not (filename.startswith("<frozen") or (code.co_name.startswith("__") and code.co_name.endswith("__"))
                    or os.path.abspath(caller).startswith(libraries)):
                foreign.append(f"{code.co_name} from {filename} (called from {os.path.basename(caller)})")
            return  # else the import system, generated methods, or a library's own exec'd code
        path = os.path.abspath(filename)
        if path.startswith(cell_dir):
            try:
                cell_code.append(inspect.getsource(code))
            except (OSError, TypeError):
                cell_code.append("")
        elif not path.startswith(roots):
            foreign.append(f"{code.co_name} from {filename}")

    args, kwargs = request["args"], dict(request["kwargs"])
    metered = kwargs.pop(METERED, ())
    launches = []
    if description["kind"] == "triton":
        cls = type(fn)
        original = cls.run

        def counting_run(self, *a, **k):
            launches.append(self is fn)
            return original(self, *a, **k)
        target = fn[request["grid"]] if request["mode"] == "launch" else fn
    else:
        target = fn
    from mamba_edu.exercises.core import memory_of, rebound
    from mamba_edu.profiling.fake_device import would_be_sync
    library = _make_ops_absent(ops, seen_forbidden)  # for this call only: put back below, whatever happens
    absent = _make_absent(functions, forbidden)
    try:
        read = would_be_sync(target, args) if request.get("fake") is True else None
        swapped, rows = meter(metered)  # after the data-less run: the judged call's rows only
        absent += swapped
        before = memory_of(args)
        syncs, recorder = None, OpRecorder()
        previous = sys.getprofile()
        result = None
        try:
            if description["kind"] == "triton":
                cls.run = counting_run
            with count_syncs(strict=True) as syncs, recorder:
                sys.setprofile(hook)
                try:
                    result = target(*args, **kwargs)
                except Exception:
                    if seen_forbidden:  # the forbidden call is the verdict, not what it raised
                        sys.setprofile(previous)
                        return {"refused": f"the answer calls {', '.join(sorted(set(seen_forbidden)))}, "
                                           "which this exercise asks you to write yourself"}
                    raise
                finally:
                    still = sys.getprofile() is hook
                    sys.setprofile(previous)
        finally:
            if description["kind"] == "triton":
                cls.run = original
        if metered:  # the grader's channel carries the result only: the rows travel with it
            result = {"result": result, "rows": rows}
        reply = {"result": _plain_copy(result), "syncs": [e.op for e in syncs.events], "data_read": read,
                 "ops": sorted(recorder.ops), "forbidden": sorted(set(seen_forbidden)),
                 "foreign": foreign[:5], "cell_code": cell_code, "launches": sum(launches),
                 "args_after": [_plain_copy(a) if type(a) is torch.Tensor else None for a in args],
                 "rebound": rebound(before, args)}
        if not still:
            reply["refused"] = "the answer switched off the grader's call tracer (sys.setprofile)"
        return reply
    finally:
        _restore(absent, library)
