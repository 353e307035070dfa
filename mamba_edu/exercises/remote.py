"""The grader's side of the channel to the learner's kernel.

:class:`KernelSession` starts a Jupyter kernel in the notebook's throwaway folder, runs the
notebook's cells there, and then hands the checks :class:`RemoteFunction` proxies instead of the
learner's functions. Calling a proxy writes the inputs to a private file (``torch.save``), asks the
kernel (a silent request, no history, no output read) to run :mod:`._harness` on them, and reads the
reply with ``torch.load(weights_only=True)``: only plain tensors, numbers, strings, lists, tuples
and dicts can come back, and :func:`check_plain` refuses anything else (a tensor subclass, a numpy
scalar). The checks compute their references in the grader's process, so nothing the notebook
prints, patches or defines can reach a verdict except through the values its functions return.
The kernel's stdout and stderr go nowhere.
"""

from __future__ import annotations

import io
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from mamba_edu.exercises import _harness
from mamba_edu.exercises.containment import KernelLimits, death_cause, read_regular
from mamba_edu.exercises.core import KernelDied, Observed

HARNESS_FILE = Path(_harness.__file__)
HARNESS_SOURCE = HARNESS_FILE.read_text()
#: Modules whose code the kernel-side instruments rely on; checked against these digests per call.
INTEGRITY_MODULES = ("mamba_edu.probes", "mamba_edu.profiling.syncs", "mamba_edu.profiling.fake_device")


class Refused(AssertionError):
    """An answer the grader does not accept (a fail with the reason)."""


class LearnerError(Exception):
    """The learner's function raised; ``str`` says what and where."""


#: The only variables the learner's kernel inherits: what Python, Jupyter, torch and Triton need to
#: run, and the grader's private folders. Tokens, credentials and the grading seed stay behind.
KERNEL_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
              "IPYTHONDIR", "MPLCONFIGDIR", "JUPYTER_RUNTIME_DIR", "TRITON_CACHE_DIR", "TRITON_INTERPRET",
              "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LD_LIBRARY_PATH")


def kernel_environment() -> dict:
    """This process's environment cut down to :data:`KERNEL_ENV`."""
    return {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}


def _fresh_digests() -> dict:
    """Digests of the instruments' code, compiled from the files (not from the loaded modules)."""
    import importlib.util

    out = {}
    for name in INTEGRITY_MODULES:
        spec = importlib.util.find_spec(name)
        namespace = {"__name__": name, "__file__": spec.origin}
        exec(compile(Path(spec.origin).read_text(), spec.origin, "exec"), namespace)  # noqa: S102
        out[name] = _harness.module_digests(namespace, name)
    return out


def check_plain(value, depth: int = 0) -> None:
    """Raise :class:`Refused` unless ``value`` is exactly a ``torch.Tensor`` (not a subclass),
    ``int``, ``float``, ``bool``, ``str``, ``None``, or a list/tuple/dict of those."""
    try:
        _harness._plain(value, depth)
    except TypeError as err:
        raise Refused(f"the answer returned {err}; expected plain torch.Tensor, numbers, lists, "
                      "tuples or dicts") from None


class KernelSession:
    """One learner kernel, running in ``folder`` (a throwaway copy), started by the launcher of
    ``limits`` (its own PID namespace and resource limits), inside ``sandbox_prefix`` (bubblewrap)
    when given."""

    def __init__(self, folder: Path, timeout: int, sandbox_prefix: list[str] | None = None,
                 channel: Path | None = None, limits: KernelLimits = KernelLimits()):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        self.folder, self.timeout, self.limits = folder, timeout, limits
        self.channel = channel or Path(tempfile.mkdtemp(prefix="mamba_edu-channel-"))
        self.own_file = f"<mamba_edu-grader-{secrets.token_hex(8)}>"
        self.digests = _fresh_digests()
        self.km = KernelManager(kernel_name="python3", transport="ipc" if sandbox_prefix else "tcp")
        if sandbox_prefix:  # no network in the sandbox: the kernel's sockets are files of the channel
            self.km.ip = str(self.channel / "kernel")
            self.km.connection_file = str(self.channel / "kernel.json")
        env = {**kernel_environment(), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
        self.km.kernel_cmd = None
        argv = KernelSpecManager().get_kernel_spec("python3").argv
        argv = [sys.executable if i == 0 and a in ("python", "python3") else a for i, a in enumerate(argv)]
        self.km.kernel_spec.argv = limits.launcher() + (sandbox_prefix or []) + argv
        self.km.start_kernel(cwd=str(folder), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=120)
        except RuntimeError as err:
            raise KernelDied(f"the kernel did not start: {err}") from None

    # --- running code ------------------------------------------------------------------------

    def execute(self, code: str, timeout: float, *, silent: bool = False, what: str = "a cell") -> dict:
        """Run ``code`` and wait for its reply; :class:`KernelDied` on death or timeout."""
        msg_id = self.kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False)
        deadline = time.monotonic() + timeout
        while True:
            self._drain()
            try:
                msg = self.kc.get_shell_msg(timeout=0.2)
            except queue.Empty:
                if not self.km.is_alive():
                    raise self.died(f"while running {what}") from None
                if time.monotonic() > deadline:
                    raise KernelDied(f"{what} ran longer than the timeout ({timeout:.0f} s)") from None
                continue
            if not (isinstance(msg, dict) and isinstance(msg.get("parent_header"), dict)
                    and isinstance(msg.get("content"), dict)):
                raise KernelDied("the kernel's messages are garbled (the notebook changed how it talks)")
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    def _drain(self) -> None:
        while True:
            try:
                self.kc.get_iopub_msg(timeout=0)
            except queue.Empty:
                return

    def run_notebook(self, cells: list[str]) -> list[str]:
        """Run every code cell; a failing cell does not stop the notebook. Returns the errors."""
        errors = []
        for number, source in enumerate(cells, 1):
            reply = self.execute(source, self.timeout, what=f"code cell {number}")
            if reply.get("status") == "error":
                error = f"{reply.get('ename')}: {reply.get('evalue')}"
                if out_of_memory(error):
                    raise KernelDied(f"code cell {number} ran out of memory ({self.limits.memory_text()}): "
                                     f"{error[:200]}")
                errors.append(f"cell {number}: {error}"[:300])
            if not self.km.is_alive():
                raise self.died(f"in code cell {number}")
        return errors

    def died(self, when: str) -> KernelDied:
        """The error for a kernel found dead ``when``, with the cause its launcher reported."""
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        cause = death_cause(process.poll(), self.limits) if process is not None else ""
        return KernelDied(f"the kernel died {when}" + (f" ({cause})" if cause else ""))

    # --- calling the learner's functions -------------------------------------------------------

    def request(self, payload: dict) -> dict:
        token = secrets.token_hex(8)
        ask, answer = self.channel / f"ask-{token}.pt", self.channel / f"reply-{token}.pt"
        torch.save(payload, ask)
        code = (f"exec(compile({HARNESS_SOURCE!r}, {self.own_file!r}, 'exec'), __mamba_ns := {{}}); "
                f"__mamba_ns['serve']({str(ask)!r}, {str(answer)!r}, {self.own_file!r}); del __mamba_ns")
        try:
            self.execute(code, self.timeout, silent=True, what=f"{payload['name']}")
            if not answer.exists():
                raise KernelDied(f"the kernel did not answer the grader's call of {payload['name']}")
            try:
                reply = torch.load(io.BytesIO(read_regular(answer)), weights_only=True)
            except Exception as err:  # noqa: BLE001 - a reply the safe loader refuses is not an answer
                raise Refused(f"the reply to {payload['name']} is not plain data "
                              f"({type(err).__name__})") from None
        finally:
            for path in (ask, answer):
                path.unlink(missing_ok=True)
        if type(reply) is not dict:
            raise Refused("the kernel's reply is not the grader's format")
        return reply

    def function(self, name: str, forbidden: tuple[str, ...], notebook_sources: list[str]) -> RemoteFunction | None:
        """A proxy for the notebook's ``name``, or None if the notebook does not define it."""
        reply = self.request({"name": name, "mode": "describe", "args": (), "kwargs": {},
                              "forbidden": (), "integrity": {}})
        if reply.get("missing"):
            return None
        return RemoteFunction(self, name, reply, forbidden, notebook_sources)

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:  # noqa: BLE001 - a dead kernel cannot be shut down twice
                pass


def out_of_memory(error: str) -> bool:
    """Whether a cell's error (``"ename: evalue"``) says an allocation failed: Python's
    ``MemoryError`` (numpy's subclass too), torch's ``can't allocate memory``."""
    name = error.split(":", 1)[0]
    return name.endswith("MemoryError") or "can't allocate memory" in error or "bad_alloc" in error


def _in_notebook(source: str, notebook_sources: list[str]) -> bool:
    """Whether a function's source (as the kernel's cell cache holds it) is in a cell of the
    submitted notebook (compared line by line, leading indentation and blank lines ignored)."""
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    if not lines:
        return False
    text = "\n".join(lines)
    return any(text in "\n".join(line.strip() for line in cell.splitlines() if line.strip())
               for cell in notebook_sources)


class RemoteFunction:
    """A learner's function in the kernel, called from the grader's process.

    ``fn(*args)`` returns its result; tensors passed as top-level arguments are updated in place
    with what the function left in them (checks of in-place answers read them). A Triton kernel is
    launched as ``fn[grid](*args)``. :meth:`observe` also returns what the instruments saw.
    """

    def __init__(self, session: KernelSession, name: str, description: dict, forbidden, notebook_sources):
        self.session, self.name, self.forbidden = session, name, tuple(forbidden)
        self.refused = description.get("refused")
        self.kind = description.get("kind", "function")
        self.notebook_sources = notebook_sources
        if self.refused is None and not _in_notebook(description.get("source", ""), notebook_sources):
            self.refused = (f"{name} was not defined by a cell of the submitted notebook "
                            "(its code is not in the notebook's cells)")

    def __repr__(self):
        return f"<the notebook's {self.name}>"

    def __getitem__(self, grid):
        if self.refused:
            raise Refused(self.refused)
        if self.kind != "triton":
            raise Refused(f"{self.name} is not a Triton kernel: it cannot be launched with a grid")
        return lambda *args, **kwargs: self._call("launch", args, kwargs, grid).result

    def __call__(self, *args, **kwargs):
        return self._call("call", args, kwargs).result

    def observe(self, *args, fake: bool = False, **kwargs) -> Observed:
        return self._call("call", args, kwargs, fake=fake)

    def _call(self, mode, args, kwargs, grid=None, fake: bool = False) -> Observed:
        if self.refused:
            raise Refused(self.refused)
        moved = [a.detach().cpu() if type(a) is torch.Tensor else a for a in args]
        reply = self.session.request({"name": self.name, "mode": mode, "grid": grid, "args": tuple(moved),
                                      "kwargs": kwargs, "forbidden": self.forbidden, "fake": fake,
                                      "integrity": self.session.digests})
        if reply.get("missing"):
            raise Refused(f"{self.name} is no longer defined in the kernel")
        if "refused" in reply:
            raise Refused(str(reply["refused"]))
        if "error" in reply:
            err = reply["error"]
            message = f"{err.get('type')}: {err.get('message')}"
            if err.get("base"):
                raise KernelDied(f"{self.name} raised {message} (a BaseException)")
            if err.get("not_done"):
                raise NotImplementedError(message)
            raise LearnerError(f"{message} ({err.get('where')})")
        for key in ("syncs", "ops", "forbidden", "foreign", "cell_code"):
            if type(reply.get(key)) is not list or any(type(x) is not str for x in reply[key]):
                raise Refused("the kernel's reply is not the grader's format")
        if reply["forbidden"]:
            raise Refused(f"the answer calls {', '.join(reply['forbidden'])}, which this exercise asks "
                          "you to write yourself")
        if reply["foreign"]:
            raise Refused(f"the answer runs code that is not in the notebook's cells: "
                          f"{'; '.join(dict.fromkeys(reply['foreign']))}")
        for source in reply["cell_code"]:
            if source and not _in_notebook(source, self.notebook_sources):
                first = source.strip().splitlines()[0][:80]
                raise Refused(f"the answer runs code that no cell of the submitted notebook holds "
                              f"({first!r})")
        if self.kind == "triton":
            if type(reply.get("launches")) is not int or reply["launches"] < 1:
                raise Refused(f"{self.name} was not launched as a Triton kernel")
        result = reply.get("result")
        check_plain(result)
        after = reply.get("args_after")
        if type(after) is not list or len(after) != len(args):
            raise Refused("the kernel's reply is not the grader's format")
        for original, new in zip(args, after):
            if type(original) is torch.Tensor and new is not None:
                check_plain(new)
                if new.shape != original.shape or new.dtype != original.dtype:
                    raise Refused(f"{self.name} changed the shape or dtype of an input tensor")
                original.copy_(new.to(original.device))
        result = _to_device(result, args)
        read = reply.get("data_read")
        if read is not None and type(read) is not str:
            raise Refused("the kernel's reply is not the grader's format")
        moved_memory = reply.get("rebound", [])
        if type(moved_memory) is not list or any(type(i) is not int for i in moved_memory):
            raise Refused("the kernel's reply is not the grader's format")
        return Observed(result, list(reply["syncs"]) + ([read] if read else []), set(reply["ops"]),
                        moved_memory)


def _to_device(result, args):
    """Tensors come back on the CPU; put them where the inputs were (a GPU grader)."""
    device = next((a.device for a in args if type(a) is torch.Tensor), None)
    if device is None or device.type == "cpu":
        return result
    if type(result) is torch.Tensor:
        return result.to(device)
    if type(result) in (tuple, list):
        return type(result)(_to_device(r, args) for r in result)
    if type(result) is dict:
        return {k: _to_device(v, args) for k, v in result.items()}
    return result
