"""Reading a Chrome/Perfetto trace file that may be anything: checked, bounded, one clear error.

A trace comes from outside (a profiler run, a colleague, a download), so :func:`read_trace_file`
and :func:`check_trace` assume nothing about it:

* **only regular files** are read. The file is opened without blocking and checked with
  ``fstat`` before a byte is read, so ``/dev/zero``, a named pipe or a folder is refused at once
  instead of filling memory or waiting for a writer;
* **gzip or plain JSON**, told apart by the first two bytes (``1f 8b``), not by the name;
* **a cap on the decompressed size** (:data:`MAX_TRACE_BYTES` by default), read as a stream: a
  gzip is first decompressed chunk by chunk and thrown away, to measure it, and refused as soon
  as it passes the cap; only a file within the cap is then read into memory. So a small gzip that
  expands to gigabytes costs a fraction of a second and almost no memory;
* **both Chrome formats**: the JSON Object Format (``{"traceEvents": [...], ...}``) and the JSON
  Array Format (``[...]``, whose closing ``]`` the format allows to be missing). Either way the
  result is an object with a ``traceEvents`` list; an array becomes ``{"traceEvents": array}``;
* **a schema check** of every event, naming the event's index and the field when one is wrong:
  every event is a JSON object; ``ts`` and ``dur``, where present, are finite numbers and ``dur``
  is not negative; a complete event (``"ph": "X"``, the only kind the analysis reads) has a
  ``ts`` and a ``dur``, a string ``name`` and ``cat``, a number or string ``pid`` and ``tid`` and
  an object ``args`` whose ``correlation``, if any, is a number or a string (each optional
  field may be absent or ``null``).

Everything that is wrong with a file raises :class:`TraceError` (a ``ValueError``) with a
one-line message; nothing else escapes (an ``OSError`` while reading becomes one too).

Pure Python, no torch: it runs wherever the traces are read.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
import zlib
from pathlib import Path

#: Default cap on a trace's JSON text after decompression (bytes). Parsed JSON takes about 11
#: times its text in Python objects (a 243 MiB trace peaked at 2.7 GB), so this cap bounds a read
#: at about 0.7 GB. The committed traces of one forward are a few MB; a whole untrimmed profile of
#: many steps may need a larger cap (``max_bytes=``), or
#: :func:`mamba_edu.profiling.traces.trim_trace` first.
MAX_TRACE_BYTES = 64 * 2**20

_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_NUMBER = (int, float)
#: Largest ``ts`` / ``dur`` magnitude accepted (µs, tens of thousands of years): sums of such
#: numbers stay finite, so no analysis turns into ``inf`` or ``nan``.
MAX_TIME_US = 1e18
_ID = (int, float, str)  # pid / tid: Kineto writes whole numbers, some rows use strings


class TraceError(ValueError):
    """A trace file (or trace object) that cannot be read or analysed; the message is one line
    and says where (``event 12, field 'dur'``) and what is wrong.

    ``index`` and ``field`` are the event's position in ``traceEvents`` and the field's name
    when the problem is in one event, else ``None``.
    """

    def __init__(self, message: str, *, index: int | None = None, field: str | None = None):
        super().__init__(" ".join(str(message).split()))  # one line, whatever came in
        self.index = index
        self.field = field


def _show(value: object, width: int = 40) -> str:
    """A short one-line ``repr`` of a bad value for a message."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


# --------------------------------------------------------------------------------------------
# Reading the bytes


def open_regular(path, what: str = "a trace file", follow_links: bool = True) -> int:
    """A blocking file descriptor of ``path``, refused (:class:`TraceError`, a ``ValueError``)
    unless it is a regular file: opened without blocking and checked with ``fstat`` before a
    byte is read, so a named pipe or a device cannot stall the reader. ``what`` names the file
    the caller expects; ``follow_links=False`` refuses a symbolic link too."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise TraceError(f"is a folder, not {what}") from None
    except OSError as err:
        raise TraceError(f"cannot be opened: {err.strerror or err}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(f"is a folder, not {what}")
        if not stat.S_ISREG(mode):
            kind = ("a named pipe" if stat.S_ISFIFO(mode) else "a character device"
                    if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise TraceError(f"is {kind}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _too_large(max_bytes: int) -> TraceError:
    return TraceError(f"holds more than {_size(max_bytes)} of JSON text (the cap: pass a larger "
                      "max_bytes, or trim the trace to one forward)")


def _gzip_size(f, max_bytes: int) -> int:
    """The decompressed size of the gzip ``f`` (every member), decompressed and thrown away
    chunk by chunk: refused past ``max_bytes`` before anything is kept in memory."""
    n = 0
    with gzip.GzipFile(fileobj=f, mode="rb") as g:
        while chunk := g.read(_CHUNK):
            n += len(chunk)
            if n > max_bytes:
                raise _too_large(max_bytes)
    f.seek(0)
    return n


def _read_capped(stream, max_bytes: int) -> bytearray:
    """All of ``stream`` in chunks, refused as soon as it passes ``max_bytes``."""
    buf = bytearray()
    while chunk := stream.read(_CHUNK):
        if len(buf) + len(chunk) > max_bytes:
            raise _too_large(max_bytes)
        buf += chunk
    return buf


def read_trace_bytes(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> bytearray:
    """The JSON text of a trace file, gunzipped if it is gzip; see the module docstring.

    A gzip is decompressed twice: once to measure it (nothing kept, stopped at the cap), then to
    keep it, so memory grows with the real size of the text, never with what a bomb expands to.
    """
    path = Path(path)
    _check_cap(max_bytes)
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb") as f:
            magic = f.read(2)
            f.seek(0)
            if magic != _GZIP_MAGIC:
                if os.fstat(f.fileno()).st_size > max_bytes:
                    raise _too_large(max_bytes)
                return _read_capped(f, max_bytes)
            _gzip_size(f, max_bytes)
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                return _read_capped(g, max_bytes)
    except TraceError:
        raise
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise TraceError(f"is a damaged or truncated gzip file ({err})") from None
    except MemoryError:
        raise TraceError("does not fit in memory") from None
    except OSError as err:
        raise TraceError(f"cannot be read: {err.strerror or err}") from None


def _check_cap(max_bytes: object) -> None:
    if type(max_bytes) is not int or max_bytes <= 0:
        raise ValueError(f"max_bytes must be a positive whole number, got {_show(max_bytes)}")


# --------------------------------------------------------------------------------------------
# Parsing and checking


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_trace_text(data: bytes | str) -> dict:
    """Parse the text of a trace in either Chrome format and :func:`check_trace` it."""
    if isinstance(data, (bytes, bytearray)):
        if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
            data = data[3:]
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise TraceError(f"is not UTF-8 text (byte {err.start}); a trace is JSON") from None
    text = data.strip()
    if not text:
        raise TraceError("is empty; a trace is a JSON object or array")
    try:
        obj = _loads(text)
    except json.JSONDecodeError as err:
        # The JSON Array Format may end without its ']' (a trace cut off by a crash).
        if text[0] != "[" or text[-1] == "]":
            raise TraceError(f"is not valid JSON: {err.msg} at line {err.lineno} column "
                             f"{err.colno}") from None
        try:
            obj = _loads(text.rstrip(",") + "]")
        except (json.JSONDecodeError, ValueError, RecursionError):
            raise TraceError(f"is not valid JSON: {err.msg} at line {err.lineno} column "
                             f"{err.colno}") from None
    except RecursionError:
        raise TraceError("is not a trace: its JSON is nested too deeply") from None
    except MemoryError:
        raise TraceError("does not fit in memory once parsed") from None
    except ValueError as err:  # NaN/Infinity, an integer with too many digits
        raise TraceError(f"is not valid JSON: {err}") from None
    return check_trace(obj)


def _loads(text: str):
    return json.loads(text, parse_constant=_reject_constant)


def read_trace_file(path: str | Path, max_bytes: int = MAX_TRACE_BYTES) -> dict:
    """Read, parse and check one trace file: ``{"traceEvents": [...], ...}``, or
    :class:`TraceError`."""
    return parse_trace_text(read_trace_bytes(path, max_bytes))


def check_trace(trace: object) -> dict:
    """``trace`` checked (every event, see the module docstring), as an object with a
    ``traceEvents`` list: a valid dict is returned itself, a list is wrapped."""
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    elif not isinstance(trace, dict):
        raise TraceError(f"is a JSON {_json_type(trace)}, not a trace (a JSON object with "
                         "'traceEvents', or an array of events)")
    if "traceEvents" not in trace:
        keys = ", ".join(repr(k) for k in list(trace)[:6]) or "none"
        raise TraceError(f"has no 'traceEvents' list (top-level keys: {keys}); not a Chrome "
                         "trace", field="traceEvents")
    events = trace["traceEvents"]
    if not isinstance(events, list):
        raise TraceError(f"'traceEvents' is a JSON {_json_type(events)}, not an array of events",
                         field="traceEvents")
    for i, e in enumerate(events):
        check_event(i, e)
    return trace


def _json_type(v: object) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(v), type(v).__name__)


def _bad(i: int, name: str, what: str) -> TraceError:
    return TraceError(f"event {i}, field {name!r}: {what}", index=i, field=name)


def _finite(i: int, e: dict, name: str) -> float:
    v = e[name]
    if type(v) not in _NUMBER:
        raise _bad(i, name, f"expected a number, got a JSON {_json_type(v)} {_show(v)}")
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise _bad(i, name, f"expected a finite number, got {_show(v)}")
    if abs(x) > MAX_TIME_US:
        raise _bad(i, name, f"{_show(v)} µs is out of range (at most {MAX_TIME_US:g} in size)")
    return x


def check_event(i: int, e: object) -> tuple | None:
    """Check event ``i``; for a complete (``"ph": "X"``) event return its fields
    ``(name, cat, start, end, pid, tid, correlation)``, else ``None``. Raises
    :class:`TraceError` naming the index and the field."""
    if not isinstance(e, dict):
        raise TraceError(f"event {i} is a JSON {_json_type(e)}, not an object", index=i)
    start = _finite(i, e, "ts") if "ts" in e else None
    dur = _finite(i, e, "dur") if "dur" in e else None
    if dur is not None and dur < 0:
        raise _bad(i, "dur", f"a duration cannot be negative, got {_show(e['dur'])}")
    if e.get("ph") != "X":
        return None
    for name, value in (("ts", start), ("dur", dur)):
        if value is None:
            raise _bad(i, name, "missing; a complete event ('ph': 'X') has 'ts' and 'dur'")
    end = start + dur
    fields = []
    for name in ("name", "cat"):
        v = e.get(name)
        if v is not None and not isinstance(v, str):
            raise _bad(i, name, f"expected a string, got a JSON {_json_type(v)} {_show(v)}")
        fields.append(v or "")
    for name in ("pid", "tid"):
        v = e.get(name)
        if v is not None and (type(v) not in _ID or (type(v) is float and not math.isfinite(v))):
            raise _bad(i, name, f"expected a number or string, got a JSON {_json_type(v)} "
                                f"{_show(v)}")
        fields.append(0 if v is None else v)
    args = e.get("args")
    if args is not None and not isinstance(args, dict):
        raise _bad(i, "args", f"expected an object, got a JSON {_json_type(args)} {_show(args)}")
    corr = (args or {}).get("correlation")
    if corr is not None and (type(corr) not in _ID
                             or (type(corr) is float and not math.isfinite(corr))):
        raise _bad(i, "args.correlation", f"expected a number or string, got a JSON "
                                          f"{_json_type(corr)} {_show(corr)}")
    name, cat, pid, tid = fields
    return name, cat, start, end, pid, tid, corr
