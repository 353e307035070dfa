"""The trace loader and ``trace`` command against hostile files: one test per bad input, a fuzz
test over mutated and truncated traces, and the committed traces (both Chrome formats) giving the
same analysis as before.

Every bad file must end in :class:`TraceError` (one line, naming the event index and field where
there is one) and, on the command line, in that line and exit status 2 — never a traceback, a
hang, quadratic time or unbounded memory.
"""

import gzip
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers import ev, run_main, small_trace, write
from mamba_edu import data_dir
from mamba_edu.profiling.bubbles import (
    MAX_STACK_DEPTH,
    TraceAnalysis,
    analyze_trace,
    load_trace,
    open_stacks,
    trace_events,
)
from mamba_edu.profiling.summary import analyze_file, pick_range, report
from mamba_edu.profiling.trace_files import MAX_TRACE_BYTES, TraceError, read_trace_file

RUNS = data_dir() / "runs"
COMMITTED = sorted(RUNS.glob("*/*.json.gz"))
GOLDEN = Path(__file__).with_name("trace_analyses_golden.json")
needs_data = pytest.mark.skipif(not COMMITTED, reason="data/ is not in this checkout")
MiB = 2**20


# --------------------------------------------------------------------------------------------
# Helpers


def refused(capsys, path: Path, *words: str) -> str:
    """``trace PATH`` exits 2 with one line on stderr that names the file and holds ``words``;
    ``load_trace`` and ``analyze_file`` raise TraceError with the same words."""
    code, out, err = run_main(capsys, "trace", str(path), "--no-plot")
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert str(path) in err
    for w in words:
        assert w in err, err
    with pytest.raises(TraceError) as info:
        analyze_file(path)
    assert "\n" not in str(info.value)
    return err


def run_cli(*argv, timeout=120) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "mamba_edu", *argv], capture_output=True,
                          text=True, env=env, timeout=timeout)


def gzip_bomb(path: Path, size: int, declared: int | None = None) -> Path:
    """A gzip of ``size`` bytes of JSON whitespace, built without compressing them: one flushed
    deflate block of 1 MiB of spaces, repeated. ``declared`` is the size its trailer claims (the
    real size by default; the CRC is not computed, nothing reads that far)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(b" " * MiB) + comp.flush(zlib.Z_FULL_FLUSH)
    head = comp.compress(b'{"traceEvents": [') + comp.flush(zlib.Z_FULL_FLUSH)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip header, no name
        f.write(head)
        for _ in range(size // MiB):
            f.write(block)
        f.write(b"\x03\x00")  # an empty final block
        f.write(struct.pack("<II", 0, (size if declared is None else declared) % 2**32))
    return path


def peak_rss_mib(code: str, timeout=120) -> tuple[float, float, str]:
    """Run ``code`` in a fresh interpreter after importing the loader: (peak RSS growth in MiB,
    seconds, stdout)."""
    prog = (
        "import resource, sys, time\n"
        "from mamba_edu.profiling.bubbles import load_trace\n"
        "from mamba_edu.profiling.trace_files import TraceError\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t0 = time.perf_counter()\n"
        f"{code}\n"
        "dt = time.perf_counter() - t0\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((peak - base) / 1024, dt)\n"
    )
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    *lines, last = r.stdout.strip().splitlines()
    grown, seconds = map(float, last.split())
    return grown, seconds, "\n".join(lines)


def digest(a: TraceAnalysis) -> str:
    """Everything an analysis found, hashed (the golden file holds these)."""
    full = [a.label, a.range_name, a.start, a.end, a.threshold_us, a.gpu_busy, a.cpu_busy,
            [(b.start, b.end, b.stack, b.op, b.runtime) for b in a.bubbles],
            [(s.name, s.kind, s.start, s.end, s.op) for s in a.syncs]]
    return hashlib.sha256(repr(full).encode()).hexdigest()


def numbers(a: TraceAnalysis) -> dict:
    """The summary without the label (a file's label is its name)."""
    return {k: v for k, v in a.summary().items() if k != "label"}


def analysis_of(path: Path) -> TraceAnalysis:
    trace = load_trace(path)
    return analyze_trace(trace, pick_range(trace, None), label=path.name.split(".")[0])


# --------------------------------------------------------------------------------------------
# The right inputs still load and give the analysis they gave before the loader was hardened


@needs_data
def test_committed_traces_give_the_recorded_analyses():
    golden = json.loads(GOLDEN.read_text())
    assert sorted(golden) == [f"{p.parent.name}/{p.name}" for p in COMMITTED]
    for p in COMMITTED:
        a = analysis_of(p)
        want = golden[f"{p.parent.name}/{p.name}"]
        assert a.summary() == want["summary"], p
        assert digest(a) == want["digest"], p


@needs_data
def test_committed_traces_in_the_array_format_give_the_same_analysis(tmp_path):
    for p in COMMITTED[:: max(len(COMMITTED) // 6, 1)]:  # one per strategy, across cases
        trace = load_trace(p)
        plain = write(tmp_path / p.name.removesuffix(".gz"), trace["traceEvents"])
        gz = write(tmp_path / p.name, trace["traceEvents"], gz=True)
        want = digest(analysis_of(p))
        assert digest(analysis_of(plain)) == digest(analysis_of(gz)) == want, p
        assert isinstance(load_trace(trace["traceEvents"]), dict)


@needs_data
def test_cli_reads_the_array_format_like_the_object_format(capsys, tmp_path):
    src = RUNS / "launch_bound_1x512" / "naive.pt.trace.json.gz"
    arr = write(tmp_path / "naive.pt.trace.json", load_trace(src)["traceEvents"])
    code, out_obj, _ = run_main(capsys, "trace", str(src), "--no-plot", "--json")
    assert code == 0
    code, out_arr, err = run_main(capsys, "trace", str(arr), "--no-plot", "--json")
    assert code == 0, err
    strip = lambda out: {k: v for k, v in json.loads(out).items() if k != "path"}  # noqa: E731
    assert strip(out_arr) == strip(out_obj)


def test_array_format_without_its_closing_bracket_loads(tmp_path):
    text = json.dumps(small_trace()["traceEvents"])
    for cut in (text[:-1], text[:-1] + ",\n"):  # the format allows the ']' to be missing
        p = write(tmp_path / "cut.json", text=cut)
        assert numbers(analyze_file(p)) == numbers(analyze_trace(small_trace()))


def test_small_trace_analysis_is_exact():
    a = analyze_trace(small_trace())
    assert [(b.start, b.end) for b in a.bubbles] == [(0, 5), (30, 60), (80, 100)]
    assert a.bubbles[1].cause == "aten::nonzero → cudaStreamSynchronize"
    assert a.n_syncs == 1


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    p = write(tmp_path / "bom.json", raw=b"\xef\xbb\xbf" + json.dumps(small_trace()).encode())
    assert analyze_file(p).bubbles


# --------------------------------------------------------------------------------------------
# Files that are not traces at all


def test_malformed_json(capsys, tmp_path):
    text = json.dumps(small_trace())
    err = refused(capsys, write(tmp_path / "cut.json", text=text[: len(text) // 2]),
                  "not valid JSON", "line 1 column")
    assert "JSONDecodeError" not in err


def test_malformed_json_in_a_gzip(capsys, tmp_path):
    refused(capsys, write(tmp_path / "bad.json.gz", text='{"traceEvents": [1, 2,', gz=True),
            "not valid JSON")


def test_empty_file(capsys, tmp_path):
    refused(capsys, write(tmp_path / "empty.json", raw=b""), "is empty")


def test_whitespace_only_file(capsys, tmp_path):
    refused(capsys, write(tmp_path / "blank.json", text=" \n\t "), "is empty")


def test_binary_junk(capsys, tmp_path):
    refused(capsys, write(tmp_path / "junk.json", raw=bytes(range(256)) * 4), "not UTF-8")


def test_truncated_gzip(capsys, tmp_path):
    data = gzip.compress(json.dumps(small_trace()).encode())
    refused(capsys, write(tmp_path / "cut.json.gz", raw=data[: len(data) // 2]),
            "damaged or truncated gzip")


def test_gzip_with_a_bad_crc(capsys, tmp_path):
    data = bytearray(gzip.compress(json.dumps(small_trace()).encode()))
    data[-8] ^= 0xFF  # the CRC32 of the trailer
    refused(capsys, write(tmp_path / "crc.json.gz", raw=bytes(data)), "damaged or truncated gzip")


def test_gzip_magic_followed_by_garbage(capsys, tmp_path):
    refused(capsys, write(tmp_path / "fake.json.gz", raw=b"\x1f\x8b" + b"garbage" * 10),
            "damaged or truncated gzip")


def test_a_gzip_named_json_and_a_plain_file_named_gz_are_read_by_content(tmp_path):
    want = numbers(analyze_trace(small_trace()))
    zipped = write(tmp_path / "t.json", small_trace(), gz=True)
    plain = write(tmp_path / "t.json.gz", small_trace())
    assert numbers(analyze_file(zipped)) == numbers(analyze_file(plain)) == want


@pytest.mark.parametrize("doc, words", [
    ("42", "JSON number, not a trace"),
    ('"trace"', "JSON string, not a trace"),
    ("null", "JSON null, not a trace"),
    ("true", "JSON boolean, not a trace"),
])
def test_top_level_not_an_object_or_array(capsys, tmp_path, doc, words):
    refused(capsys, write(tmp_path / "top.json", text=doc), words)


def test_object_without_trace_events(capsys, tmp_path):
    refused(capsys, write(tmp_path / "other.json", {"schemaVersion": 1, "events": []}),
            "no 'traceEvents' list", "'schemaVersion'")


def test_trace_events_not_a_list(capsys, tmp_path):
    refused(capsys, write(tmp_path / "te.json", {"traceEvents": {"0": {}}}),
            "'traceEvents' is a JSON object, not an array")


def test_json_nested_too_deeply(capsys, tmp_path):
    refused(capsys, write(tmp_path / "deep.json", text="[" * 200_000 + "]" * 200_000),
            "nested too deeply")


def test_integer_with_too_many_digits(capsys, tmp_path):
    refused(capsys, write(tmp_path / "big.json", text='{"traceEvents": [{"ts": '
                                                      + "9" * 10_000 + "}]}"),
            "not valid JSON")


def test_nan_literal(capsys, tmp_path):
    text = json.dumps(small_trace()).replace('"ts": 5,', '"ts": NaN,', 1)
    refused(capsys, write(tmp_path / "nan.json", text=text), "NaN is not a JSON number")


# --------------------------------------------------------------------------------------------
# One bad event: the message names its index and field


def mutated(**change):
    """``small_trace()`` with event 4 (kernel K1) changed: ``field=value``, or deleted with
    ``field=DELETE``."""
    trace = small_trace()
    e = trace["traceEvents"][4]
    for k, v in change.items():
        if v is DELETE:
            del e[k]
        else:
            e[k] = v
    return trace


DELETE = object()


@pytest.mark.parametrize("change, field, words", [
    ({"ts": "5"}, "ts", "expected a number, got a JSON string '5'"),
    ({"ts": None}, "ts", "expected a number, got a JSON null"),
    ({"ts": True}, "ts", "expected a number, got a JSON boolean"),
    ({"ts": 1e999}, "ts", "expected a finite number"),
    ({"ts": 1e300}, "ts", "out of range"),
    ({"dur": -3}, "dur", "cannot be negative"),
    ({"dur": [1]}, "dur", "expected a number, got a JSON array"),
    ({"dur": DELETE}, "dur", "missing"),
    ({"ts": DELETE}, "ts", "missing"),
    ({"name": 17}, "name", "expected a string, got a JSON number 17"),
    ({"cat": ["kernel"]}, "cat", "expected a string, got a JSON array"),
    ({"pid": {"a": 1}}, "pid", "expected a number or string, got a JSON object"),
    ({"tid": [7]}, "tid", "expected a number or string, got a JSON array"),
    ({"args": [1, 2]}, "args", "expected an object, got a JSON array"),
    ({"args": {"correlation": [1]}}, "args.correlation", "expected a number or string"),
])
def test_bad_field_is_named_with_its_event_index(capsys, tmp_path, change, field, words):
    text = json.dumps(mutated(**change)).replace("Infinity", "1e999")  # a number JSON allows
    err = refused(capsys, write(tmp_path / "bad.json", text=text), f"event 4, field {field!r}",
                  words)
    assert err.startswith("mamba-edu trace: ")
    with pytest.raises(TraceError) as info:
        load_trace(mutated(**change))  # the same check in memory
    assert (info.value.index, info.value.field) == (4, field)


def test_event_that_is_not_an_object(capsys, tmp_path):
    trace = small_trace()
    trace["traceEvents"][3] = "cudaLaunchKernel"
    refused(capsys, write(tmp_path / "str.json", trace), "event 3 is a JSON string, not an object")


def test_bad_ts_on_an_event_the_analysis_skips_is_still_named(capsys, tmp_path):
    trace = small_trace()
    trace["traceEvents"][9]["ts"] = "2"  # the flow event ('ph': 's')
    refused(capsys, write(tmp_path / "flow.json", trace), "event 9, field 'ts'")


def test_nan_in_memory_is_refused():
    trace = mutated(ts=math.nan)
    with pytest.raises(TraceError, match="event 4, field 'ts': expected a finite number"):
        analyze_trace(trace)
    with pytest.raises(TraceError, match="event 4"):
        trace_events(trace)


# --------------------------------------------------------------------------------------------
# Things that are not regular files, and sizes


def test_dev_zero_is_refused_at_once():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    r = run_cli("trace", "/dev/zero", "--no-plot", timeout=60)
    assert r.returncode == 2, r.stderr
    assert "is a character device, not a regular file" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(TraceError, match="character device"):
        load_trace("/dev/zero")


def test_named_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = run_cli("trace", str(fifo), "--no-plot", timeout=60)  # a hang fails on the timeout
    assert r.returncode == 2, r.stderr
    assert "is a named pipe, not a regular file" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 60
    with pytest.raises(TraceError, match="named pipe"):
        load_trace(fifo)


def test_symlink_to_dev_zero_is_refused(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    link = tmp_path / "zero.json.gz"
    link.symlink_to("/dev/zero")
    with pytest.raises(TraceError, match="character device"):
        analyze_file(link)


def test_folder_given_to_the_loader(tmp_path):
    with pytest.raises(TraceError, match="is a folder"):
        load_trace(tmp_path)


def test_folder_with_a_named_pipe_and_a_bad_trace(capsys, tmp_path):
    os.mkfifo(tmp_path / "pipe.json")  # not a file: not listed, not opened
    write(tmp_path / "a_good.json", small_trace())
    write(tmp_path / "b_bad.json", text="{")
    code, out, err = run_main(capsys, "trace", str(tmp_path), "--no-plot")
    assert code == 2 and "a_good.json" in out
    assert err.count("\n") == 1 and "b_bad.json: is not valid JSON" in err


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads files whatever their mode")
def test_unreadable_file(capsys, tmp_path):
    p = write(tmp_path / "secret.json", small_trace())
    p.chmod(0)
    refused(capsys, p, "cannot be opened")


def test_gzip_bomb_is_refused_quickly_with_bounded_memory(capsys, tmp_path):
    bomb = gzip_bomb(tmp_path / "bomb.json.gz", 2**30)  # 1 GiB of JSON in about 1 MB
    assert bomb.stat().st_size < 2 * MiB
    t0 = time.monotonic()
    refused(capsys, bomb, f"holds more than {MAX_TRACE_BYTES // MiB} MiB of JSON text")
    assert time.monotonic() - t0 < 20
    grown, seconds, out = peak_rss_mib(
        "try:\n"
        f"    load_trace({str(bomb)!r})\n"
        "except TraceError as e:\n"
        "    print('refused' if 'more than' in str(e) else str(e))\n")
    assert out == "refused"
    assert grown < 64, grown  # measured chunk by chunk, nothing kept
    assert seconds < 10, seconds


def test_gzip_bomb_with_a_lying_trailer_is_refused_the_same_way(tmp_path):
    bomb = gzip_bomb(tmp_path / "liar.json.gz", 2**30, declared=1000)
    with pytest.raises(TraceError, match="more than 8 MiB of JSON text"):
        read_trace_file(bomb, max_bytes=8 * MiB)
    grown, seconds, out = peak_rss_mib(
        "try:\n"
        f"    load_trace({str(bomb)!r})\n"
        "except TraceError as e:\n"
        "    print('refused' if 'more than' in str(e) else str(e))\n")
    assert out == "refused" and grown < 64 and seconds < 10, (grown, seconds)


def test_plain_file_over_the_cap(tmp_path):
    p = write(tmp_path / "big.json", text='{"traceEvents": [' + " " * (2 * MiB) + "]}")
    with pytest.raises(TraceError, match="more than 1 MiB of JSON text"):
        load_trace(p, max_bytes=MiB)
    assert load_trace(p)["traceEvents"] == []


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "1"])
def test_bad_cap_is_a_value_error(tmp_path, cap):
    p = write(tmp_path / "t.json", small_trace())
    with pytest.raises(ValueError, match="max_bytes"):
        load_trace(p, max_bytes=cap)


# --------------------------------------------------------------------------------------------
# Many overlapping events: no quadratic time


def staircase(n: int) -> dict:
    """``n`` CPU ops that each overlap the next (badly nested: none ends before the next starts)
    and ``n`` tiny kernels between them: ``n`` bubbles, each with ``n/2`` ops open on average."""
    events = [ev("prefill_forward", "user_annotation", 0, 2 * n + 10)]
    for i in range(n):
        events.append(ev(f"op{i}", "cpu_op", 1 + i, n))
        events.append(ev("K", "kernel", 1.5 + 2 * i, 0.1, pid=0, tid=7))
    return {"traceEvents": events}


def test_overlapping_events_take_n_log_n_time():
    n = 50_000  # the former sweep held n²/2 stack entries here (tens of GB, minutes)
    t0 = time.perf_counter()
    a = analyze_trace(staircase(n), threshold_us=0.5)
    assert time.perf_counter() - t0 < 30
    assert len(a.bubbles) == n + 1
    assert max(len(b.stack) for b in a.bubbles) == MAX_STACK_DEPTH
    k = n // 4  # bubble k starts at 2k - 0.4, when ops 0 .. 2k - 2 are all open
    inner = 2 * k - 2
    assert a.bubbles[k].op == f"op{inner}"
    assert a.bubbles[k].stack == tuple(f"op{j}" for j in range(inner - MAX_STACK_DEPTH + 1,
                                                               inner + 1))


def test_open_stacks_match_a_brute_force_sweep():
    import random

    rng = random.Random(0)
    raw = [ev(f"e{i}", rng.choice(["cpu_op", "cuda_runtime", "user_annotation"]),
              rng.randrange(100), rng.randrange(1, 40)) for i in range(300)]
    events = trace_events(raw)
    times = [rng.uniform(-5, 140) for _ in range(200)] + [float(e.start) for e in events[:50]]
    for t, got in zip(times, open_stacks(events, times, depth=10**6)):
        assert got == [e for e in events if e.start <= t < e.end]
    for t, got in zip(times, open_stacks(events, times, depth=3)):
        assert got == [e for e in events if e.start <= t < e.end][-3:]


# --------------------------------------------------------------------------------------------
# Command-line numbers, --out and --strategies


@pytest.mark.parametrize("argv, words", [
    (["--threshold-us", "nan"], "--threshold-us: expected a finite number, got 'nan'"),
    (["--threshold-us", "inf"], "--threshold-us: expected a finite number, got 'inf'"),
    (["--threshold-us", "-1"], "--threshold-us: must be above 0"),
    (["--threshold-us=-inf"], "--threshold-us: expected a finite number, got '-inf'"),
])
def test_trace_bad_threshold_is_a_usage_error(capsys, tmp_path, argv, words):
    p = write(tmp_path / "t.json", small_trace())
    code, out, err = run_main(capsys, "trace", str(p), "--no-plot", *argv)
    assert code == 2 and words in err and out == "" and "Traceback" not in err


@pytest.mark.parametrize("value, words", [
    ("nan", "expected a finite number, got 'nan'"),
    ("inf", "expected a finite number, got 'inf'"),
    ("-5", "must be above 0"),
])
def test_bench_bad_max_minutes_is_a_usage_error(capsys, value, words):
    code, out, err = run_main(capsys, "bench", "--max-minutes", value)
    assert code == 2 and f"--max-minutes: {words}" in err and out == ""


def test_bench_duplicate_strategies_are_a_usage_error(capsys, tmp_path):
    code, out, err = run_main(capsys, "bench", "--strategies", "naive,naive", "--out",
                              str(tmp_path / "bench"))
    assert code == 2 and "--strategies lists naive twice" in err and out == ""


def test_trace_out_pointing_at_a_folder_is_a_usage_error(capsys, tmp_path):
    p = write(tmp_path / "t.json", small_trace())
    folder = tmp_path / "figure.png"
    folder.mkdir()
    code, out, err = run_main(capsys, "trace", str(p), "--out", str(folder))
    assert code == 2 and f"--out {folder}: is a folder" in err and out == ""


def test_trace_index_out_of_range(capsys, tmp_path):
    p = write(tmp_path / "t.json", small_trace())
    code, _, err = run_main(capsys, "trace", str(p), "--no-plot", "--index", "5")
    assert code == 2
    assert "no occurrence 5 of the range 'prefill_forward': the trace has 1" in err
    with pytest.raises(IndexError):  # still an IndexError for callers that catch one
        analyze_trace(small_trace(), index=-2)


@pytest.mark.parametrize("threshold", [math.nan, math.inf, -1.0, "5", True])
def test_analyze_trace_refuses_a_bad_threshold(threshold):
    with pytest.raises((ValueError, TypeError), match="threshold_us"):
        analyze_trace(small_trace(), threshold_us=threshold)


# --------------------------------------------------------------------------------------------
# Fuzz: mutated and truncated traces give an analysis or a TraceError, nothing else

JSON_SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                           max_leaves=6)
FIELDS = ["ph", "ts", "dur", "name", "cat", "pid", "tid", "args", "id"]


def outcome(path: Path):
    """analyze_file's result, which must be an analysis that reports cleanly, or TraceError."""
    try:
        a = analyze_file(path)
    except TraceError as err:
        assert "\n" not in str(err)
        return err
    assert isinstance(a, TraceAnalysis)
    summary = a.summary()
    assert all(math.isfinite(v) for v in summary.values() if isinstance(v, float)), summary
    json.dumps(summary, allow_nan=False)
    report(a, path, 5)
    return a


@st.composite
def mutations(draw):
    trace = small_trace()
    events = trace["traceEvents"]
    for _ in range(draw(st.integers(1, 4))):
        what = draw(st.sampled_from(["set", "delete", "replace", "insert", "args", "top"]))
        i = draw(st.integers(0, len(events) - 1))
        if what == "set":
            events[i][draw(st.sampled_from(FIELDS))] = draw(JSON_VALUES)
        elif what == "delete":
            events[i].pop(draw(st.sampled_from(FIELDS)), None)
        elif what == "replace":
            events[i] = draw(JSON_VALUES)
            break  # later steps index events as objects
        elif what == "insert":
            events.insert(i, {k: draw(JSON_VALUES) for k in draw(st.sets(st.sampled_from(FIELDS)))})
        elif what == "args":
            events[i]["args"] = {"correlation": draw(JSON_VALUES)}
        else:
            trace = draw(st.sampled_from([events, {"traceEvents": draw(JSON_VALUES)},
                                          draw(JSON_VALUES), trace]))
            break
    return trace


FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(doc=mutations(), gz=st.booleans())
def test_fuzz_mutated_traces(tmp_path, doc, gz):
    path = write(tmp_path / "m.json", text=json.dumps(doc), gz=gz)  # NaN/Infinity literals too
    outcome(path)
    if isinstance(doc, (dict, list)):  # the same object in memory (NaN and inf included)
        try:
            analyze_trace(doc)
        except TraceError:
            pass


@FUZZ
@given(cut=st.floats(0, 1), gz=st.booleans(), array=st.booleans(),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=3))
def test_fuzz_truncated_and_corrupted_traces(tmp_path, cut, gz, array, flips):
    doc = small_trace()["traceEvents"] if array else small_trace()
    data = bytearray(json.dumps(doc).encode())
    if gz:
        data = bytearray(gzip.compress(bytes(data)))
    for where, byte in flips:
        data[min(int(where * len(data)), len(data) - 1)] = byte
    data = data[: int(cut * len(data))]
    outcome(write(tmp_path / "t.json.gz", raw=bytes(data)))


def test_trace_out_pointing_at_a_named_pipe_is_a_usage_error(capsys, tmp_path):
    p = write(tmp_path / "t.json", small_trace())
    os.mkfifo(tmp_path / "figure.png")  # savefig would wait for a reader
    code, out, err = run_main(capsys, "trace", str(p), "--out", str(tmp_path / "figure.png"))
    assert code == 2 and "exists and is not a regular file" in err and out == ""


def test_trace_empty_range_name_is_named_as_given(capsys, tmp_path):
    p = write(tmp_path / "t.json", small_trace())
    code, _, err = run_main(capsys, "trace", str(p), "--no-plot", "--range", "")
    assert code == 2 and "no CPU range named ''" in err and "prefill_forward" in err
