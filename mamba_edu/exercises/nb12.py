"""Checks of notebook 12 (SGLang's open issue #35851: the GDN layer inside the prefill graph).

1. ``my_fixed_plan`` — a token bucket's padded host lists for one batch: the lengths with the
   dummy row and the zero-length rows, the working slots with −1 for padding, and the chunk
   table padded to the bucket's fixed capacity with ``(R − 1, EMPTY_CHUNK)`` rows; compared with
   what :class:`~mamba_edu.engine.bucket.StaticBucket` builds (:func:`fixed_plan`), on many random
   batches, a full bucket and a single request.
2. ``my_idle_per_break`` — read the GPU idle time per break from the events of a profiled
   breakable forward: the union of the GPU intervals (kernels, copies, memsets, on any stream),
   the span from the first to the last of them, breaks = graph launches − 1; on synthetic traces
   built here, with the profiler's own start delay, overlapping and nested kernels, the forward's
   GPU range annotation, events in no particular order.
3. ``my_cut_prediction`` — predict-then-measure: the pieces and breaks of one captured forward
   for a model of ``n_layers`` layers (full attention every ``attn_every``-th, 0 for none) in each
   capture mode; the check measures them with the engine's own cut (counts: tolerance 0).
"""

from __future__ import annotations

import copy
import math
import random

from mamba_edu.exercises.core import check_seed, checker, exercise
from mamba_edu.exercises.nb06 import is_count
from mamba_edu.kernels.metadata import EMPTY_CHUNK, chunk_table
from mamba_edu.engine.bucket import Bucket

NOTEBOOK = "12_sglang_open_issue_35851"
check = checker(NOTEBOOK)
CHUNK = 64


# --- exercise 1: the fixed-capacity plan --------------------------------------------------------

def fixed_plan(lengths, working_slots, max_tokens: int, max_requests: int):
    """``(padded_lengths, state_indices, chunk_rows)`` as :meth:`StaticBucket.fill` builds them for
    a batch of ``lengths`` (its requests' new tokens) in the bucket ``(max_tokens, max_requests)``;
    ``chunk_rows`` is a list of ``(sequence, chunk)`` pairs (tests/exercises/test_exercises_nb12.py checks
    that this is what the bucket uploads)."""
    bucket = Bucket(max_tokens, max_requests)
    padded, slots = bucket.pad(lengths, working_slots)
    flat = chunk_table(padded, bucket.chunk_capacity)
    return padded, slots, list(zip(flat[0::2], flat[1::2]))


def _split(rng: random.Random, total: int, n: int) -> list[int]:
    cuts = sorted(rng.sample(range(1, total), n - 1)) if n > 1 else []
    return [b - a for a, b in zip([0, *cuts], [*cuts, total])]


def _plan_cases():
    """(lengths, max_tokens, max_requests): the traps first, then seeded random batches."""
    yield [65, 65, 65], 256, 3        # 7 chunks, more than ceil(256 / 64) = 4
    yield [256], 256, 1               # a full bucket: no padding token, the dummy row has 0
    yield [1], 64, 1                  # one short request
    yield [100, 28], 128, 4           # full, fewer requests than rows
    yield [64, 64, 64, 64], 256, 4    # full, every row a request
    yield [30], 1000, 5               # a small batch in a large bucket
    yield [1, 1, 1], 200, 3           # three chunks of one token each
    rng = random.Random(check_seed(12))
    for _ in range(40):
        max_requests = rng.randint(1, 6)
        max_tokens = rng.choice([64, 100, 128, 192, 256, 300, 640, 1000])
        n = rng.randint(1, min(max_requests, max_tokens))
        total = max_tokens if rng.random() < 0.25 else rng.randint(n, max_tokens)
        yield _split(rng, total, n), max_tokens, max_requests


def _ints(name: str, values) -> list[int]:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise AssertionError(f"{name} must be a list of ints; got {values!r:.120}") from None


def _pairs(values) -> list[tuple[int, int]]:
    try:
        rows = [tuple(int(x) for x in row) for row in values]
    except TypeError:
        raise AssertionError("chunk_rows must be a list of (sequence, chunk) pairs, one per program of "
                             "the chunk kernels (not a flat list)") from None
    if any(len(row) != 2 for row in rows):
        raise AssertionError("chunk_rows must be a list of (sequence, chunk) pairs, one per program")
    return rows


def _compare_plan(got, lengths, working, max_tokens, max_requests) -> None:
    want_lengths, want_slots, want_rows = fixed_plan(lengths, working, max_tokens, max_requests)
    rows, n, pad = max_requests + 1, len(lengths), max_tokens - sum(lengths)
    capacity = max_tokens // CHUNK + rows
    what = (f"(lengths {lengths}, working_slots {working}, max_tokens {max_tokens}, "
            f"max_requests {max_requests})")
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError("return a tuple of three lists: (padded_lengths, state_indices, chunk_rows)")
    got_lengths, got_slots = _ints("padded_lengths", got[0]), _ints("state_indices", got[1])
    got_rows = _pairs(got[2])
    if len(got_lengths) != rows or len(got_slots) != rows:
        raise AssertionError(
            f"{len(got_lengths)} lengths and {len(got_slots)} state indices; a bucket's graph always runs "
            f"max_requests + 1 = {rows} rows: the live requests, one dummy row, then rows of 0 tokens {what}")
    if got_lengths != want_lengths:
        if got_lengths[:n] != list(lengths):
            raise AssertionError(f"padded_lengths = {got_lengths}: the live rows come first, unchanged {what}")
        if sum(got_lengths) != max_tokens:
            raise AssertionError(
                f"padded_lengths = {got_lengths} add up to {sum(got_lengths)} tokens; the graph runs "
                f"max_tokens = {max_tokens}, so the dummy row takes the {pad} padding tokens {what}")
        raise AssertionError(
            f"padded_lengths = {got_lengths}; expected {want_lengths}: all {pad} padding tokens go to one "
            f"dummy row right after the live rows, and the rows after it have 0 tokens {what}")
    if got_slots != want_slots:
        if got_slots[:n] != list(working):
            raise AssertionError(f"state_indices = {got_slots}: the live rows keep their working slots {what}")
        if any(s >= 0 for s in got_slots[n:]):
            raise AssertionError(
                f"state_indices = {got_slots}: a padding row with slot {max(got_slots[n:])} would start from "
                f"that slot's state and write its garbage back into it (slot 0 is the scratch slot, the "
                f"others belong to requests); −1 makes the kernels start it from zeros and write no state {what}")
        raise AssertionError(f"state_indices = {got_slots}; expected {want_slots} {what}")
    used = sum(math.ceil(L / CHUNK) for L in want_lengths)
    if len(got_rows) != capacity:
        hint = (f"; ceil(max_tokens/64) = {math.ceil(max_tokens / CHUNK)} is not enough: rows of 65 tokens "
                f"need 2 chunks each" if len(got_rows) == math.ceil(max_tokens / CHUNK) else "")
        raise AssertionError(
            f"chunk_rows has {len(got_rows)} rows; the grid is fixed at capacity ⌊max_tokens/64⌋ + rows = "
            f"{max_tokens // CHUNK} + {rows} = {capacity} (this batch uses {used}){hint} {what}")
    if got_rows[:used] != want_rows[:used]:
        i = next(i for i in range(used) if got_rows[i] != want_rows[i])
        raise AssertionError(f"chunk row {i} = {got_rows[i]}; expected {want_rows[i]} (one row per chunk, "
                             f"sequence by sequence, rows of 0 tokens have none) {what}")
    # an unused row names the last row and a chunk past any batch: EMPTY_CHUNK or any larger index
    bad = next((row for row in got_rows[used:] if row[0] != rows - 1 or row[1] < EMPTY_CHUNK), None)
    if bad is not None:
        if 0 <= bad[0] < rows and want_lengths[bad[0]] == 0 and bad[1] < EMPTY_CHUNK:
            raise AssertionError(
                f"chunk row {got_rows.index(bad, used)} is {bad}, but row {bad[0]} has 0 tokens: rows of 0 tokens "
                f"have none; after the batch's {used} chunks every row is (rows − 1, EMPTY_CHUNK) = "
                f"{want_rows[-1]} {what}")
        why = (f"chunk {bad[1]} is not past the batch (EMPTY_CHUNK = {EMPTY_CHUNK}): that program would find "
               "tokens and write output and state again" if bad[1] < EMPTY_CHUNK
               else f"it names row {bad[0]}, not the last row {rows - 1}")
        raise AssertionError(
            f"an unused chunk row is {bad}: {why}; point every unused row past the batch, "
            f"(rows − 1, EMPTY_CHUNK) = {want_rows[-1]} {what}")


@exercise(NOTEBOOK, 1, "a bucket's fixed-capacity plan", "my_fixed_plan",
          forbidden=("mamba_edu.kernels.metadata", "mamba_edu.engine.bucket", "mamba_edu.gdn.varlen"))
def check_fixed_plan(fn) -> str:
    """Compare ``fn(lengths, working_slots, max_tokens, max_requests)`` with the bucket's lists."""
    rng, count = random.Random(check_seed(35851)), 0
    for lengths, max_tokens, max_requests in _plan_cases():
        working = rng.sample(range(1, 60), len(lengths))
        got = fn(list(lengths), list(working), max_tokens, max_requests)
        _compare_plan(got, lengths, working, max_tokens, max_requests)
        count += 1
    return (f"{count} batches (full buckets, one request, 65-token rows) match the bucket's padded lengths, "
            "slots and fixed-capacity chunk table")


# --- exercise 2: idle time per break --------------------------------------------------------------

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _x(name, cat, start, dur, tid, **extra):
    return dict(ph="X", name=name, cat=cat, ts=round(start, 3), dur=round(dur, 3), pid=1 if cat in
                GPU_CATEGORIES or cat == "gpu_user_annotation" else 0, tid=tid, **extra)


def synthetic_trace(rng: random.Random, pieces: int) -> list[dict]:
    """The events of one profiled breakable forward of ``pieces`` graph pieces (made up, in the
    format of a ``torch.profiler`` Chrome trace), shuffled."""
    events = [dict(ph="M", name="process_name", pid=0, args={"name": "python"}),
              dict(ph="M", name="process_name", pid=1, args={"name": "GPU 0"})]
    host, corr = 0.0, 1
    delay = rng.uniform(800, 3000)                      # the profiler starts well before any GPU work
    events.append(_x("ProfilerStep#1", "user_annotation", host, 0, 11))
    events.append(_x("aten::copy_", "cpu_op", host + 20, delay - 40, 11))
    t = delay
    events.append(_x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", t, rng.uniform(4, 15), 7))  # the refill
    t = events[-1]["ts"] + events[-1]["dur"] + rng.uniform(3, 10)
    first_gpu = delay
    for p in range(pieces):
        events.append(_x("cudaGraphLaunch", "cuda_runtime", t - rng.uniform(5, 12), rng.uniform(3, 8), 11,
                         args={"correlation": corr}))
        corr += 1
        a = rng.uniform(30, 60)                         # a long kernel on one stream ...
        events.append(_x("gemm", "kernel", t, a, 7))
        events.append(_x("rmsnorm", "kernel", t + 3, rng.uniform(2, 5), 13))   # ... one nested in it
        events.append(_x("silu_mul", "kernel", t + 15, rng.uniform(4, 10), 13))  # ... and one more
        t += a
        for _ in range(rng.randint(1, 4)):              # back-to-back kernels of the piece
            d = rng.uniform(5, 25)
            events.append(_x("gemm", "kernel", t, d, 7))
            t += d + rng.uniform(0, 1.5)
        if rng.random() < 0.5:
            events.append(_x("Memset (Device)", "gpu_memset", t, rng.uniform(1, 3), 7))
            t = events[-1]["ts"] + events[-1]["dur"]
        if p < pieces - 1:                              # a break: idle, eager kernels, idle again
            t += rng.uniform(150, 700)
            for _ in range(rng.randint(2, 5)):
                d = rng.uniform(4, 20)
                events.append(_x("chunk_fwd_kernel", "kernel", t, d, 7))
                events.append(_x("cudaLaunchKernel", "cuda_runtime", t - 8, 4, 11, args={"correlation": corr}))
                corr += 1
                t += d + rng.uniform(5, 40)
            t += rng.uniform(20, 200)
    t += rng.uniform(50, 150)                           # the eager tail: the LM head
    head = rng.uniform(20, 60)
    events.append(_x("lm_head_gemm", "kernel", t, head, 7))
    # on the other stream, a kernel that starts before the LM head and ends after it: the span ends
    # with the kernel that ends last, not with the one that starts last
    events.append(_x("logits_cast", "kernel", t - rng.uniform(2, 8), head + rng.uniform(12, 30), 13))
    last_gpu = events[-1]["ts"] + events[-1]["dur"]
    events.append(_x("prefill_forward", "gpu_user_annotation", first_gpu, last_gpu - first_gpu, 7))
    events.append(_x("cudaDeviceSynchronize", "cuda_runtime", last_gpu - 30, 30 + rng.uniform(10, 80), 11))
    events.append(_x("prefill_forward", "user_annotation", 5.0, events[-1]["ts"] + events[-1]["dur"], 11))
    for k in range(3):
        events.append(dict(ph="s", cat="ac2g", name="ac2g", id=k, ts=round(delay + 10 * k, 3), pid=0, tid=11))
        events.append(dict(ph="f", cat="ac2g", name="ac2g", id=k, ts=round(delay + 10 * k + 5, 3), pid=1,
                           tid=7, bp="e"))
    events.append(dict(ph="i", name="marker", ts=round(delay / 2, 3), pid=0, tid=11, s="t"))
    rng.shuffle(events)
    return events


def _union(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def idle_per_break(events) -> dict:
    """What the check expects, and the parts it is made of (µs)."""
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events
           if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    busy = sum(e - s for s, e in _union(gpu))
    span = max(e for _, e in gpu) - min(s for s, _ in gpu)
    pieces = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                 and e.get("name") == "cudaGraphLaunch")
    return dict(busy=busy, span=span, pieces=pieces, breaks=pieces - 1, idle=(span - busy) / (pieces - 1))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def _diagnose(got: float, events, want: dict) -> str:
    """The likely mistake behind ``got``, or ''."""
    xs = [e for e in events if e.get("ph") == "X"]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("cat") in GPU_CATEGORIES]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("cat") == "kernel"]
    start, end = min(s for s, _ in gpu), max(e for _, e in gpu)
    first_any, last_any = min(e["ts"] for e in xs), max(e["ts"] + e["dur"] for e in xs)
    busy, breaks = want["busy"], want["breaks"]
    summed = sum(e - s for s, e in gpu)
    naive_gaps, prev_end = 0.0, None
    for s, e in sorted(gpu):
        if prev_end is not None and s > prev_end:
            naive_gaps += s - prev_end
        prev_end = e
    k_busy = sum(e - s for s, e in _union(kernels))
    k_span = max(e for _, e in kernels) - min(s for s, _ in kernels)
    gpu_lane = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("pid") == 1]
    lane_busy = sum(e - s for s, e in _union(gpu_lane))
    guesses = [
        ((end - first_any - busy) / breaks, "your span starts at the trace's first event, the profiler's own "
         f"start ({start - first_any:.0f} µs before the first GPU work): start it at the first GPU event"),
        ((last_any - start - busy) / breaks, "your span ends at the trace's last event (a host call): end it "
         "at the last GPU event"),
        ((last_any - first_any - busy) / breaks, "your span runs from the trace's first to its last event "
         "(host events included): take it from the first to the last GPU event"),
        ((end - start - summed) / breaks, "you summed the GPU events' durations: kernels that overlap (two "
         "streams) count once; take the length of the union of the intervals"),
        (naive_gaps / breaks, "you added the gaps between consecutive intervals sorted by start, from each "
         "one's own end: a short kernel nested in a long one makes a gap that is not idle; keep the running "
         "maximum of the ends (the union)"),
        ((end - start - busy) / want["pieces"], f"you divided by the pieces ({want['pieces']} graph launches): a "
         f"forward of P pieces has P − 1 = {breaks} break{'s' * (breaks != 1)} between them"),
        ((k_span - k_busy) / breaks, "you kept the kernels only: copies (gpu_memcpy) and memsets (gpu_memset) "
         "keep the GPU busy too"),
        ((end - start - lane_busy) / breaks, "you counted every event on the GPU's lane, the forward's "
         "gpu_user_annotation range too, which covers the whole forward: keep kernel, gpu_memcpy, gpu_memset"),
    ]
    return next((why for value, why in guesses if _close(got, value)), "")


@exercise(NOTEBOOK, 2, "idle time per break, from a trace", "my_idle_per_break",
          forbidden=("mamba_edu.profiling.bubbles",))
def check_idle_per_break(fn) -> str:
    """Synthetic traces of breakable forwards of 2 to 14 pieces; compare with :func:`idle_per_break`."""
    rng = random.Random(check_seed(590))
    sizes = [2, 3, 5, 8, 14] + [rng.randint(2, 14) for _ in range(15)]
    for trial, pieces in enumerate(sizes):
        events = synthetic_trace(random.Random(check_seed(1000 + trial)), pieces)
        got = fn(copy.deepcopy(events))
        want = idle_per_break(events)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise AssertionError(f"return one number, the idle µs per break; got {type(got).__name__}") from None
        if not math.isfinite(got) or not _close(got, want["idle"]):
            why = _diagnose(got, events, want)
            raise AssertionError(
                f"trace {trial + 1} ({pieces} pieces): {got:.3f} µs per break, expected {want['idle']:.3f} "
                f"(GPU busy {want['busy']:.1f} µs of a {want['span']:.1f} µs span, {want['breaks']} "
                f"break{'s' * (want['breaks'] != 1)})"
                + (f": {why}" if why else ""))
    return (f"{len(sizes)} traces of 2 to 14 pieces: idle per break = (span − union of GPU intervals) / "
            "(graph launches − 1)")


# --- exercise 3: predict, then measure the cut ------------------------------------------------------

#: (n_layers, attn_every) of exercise 3's check: the tiny model, Qwen3.5's and Qwen3-Next's depths,
#: a last layer that is GDN, no attention at all, attention only, attention every other layer.
CUT_LAYOUTS = ((4, 4), (60, 4), (48, 4), (7, 4), (6, 0), (5, 1), (9, 2), (1, 0))
CUT_MODES = ("breakable", "gdn_inside", "graph")


def measured_cut(n_layers: int, attn_every: int, mode: str) -> tuple[int, int]:
    """``(pieces, breaks)`` of one forward of a narrow model of that layout, captured in ``mode``
    with ``graphs=False`` and cut as :func:`~mamba_edu.serving.breakable.run_in_pieces` cuts it
    (``graph``: one piece)."""
    from mamba_edu.engine import Engine, Request
    from mamba_edu.model import build_model
    from mamba_edu.serving.breakable import Pieces, run_in_pieces
    model = build_model("tiny", device="cpu", n_layers=n_layers, attn_every=attn_every, hidden=32, vocab=64,
                        mlp_width=32, gdn_key_heads=1, gdn_value_heads=1, gdn_key_dim=16, gdn_value_dim=16,
                        attn_heads=1, attn_kv_heads=1, attn_head_dim=16)
    bucket = Bucket(64, 1)
    engine = Engine(model, strategy="sync_free", max_requests=1)
    captured = engine.capture_prefill(bucket, mode, graphs=False)
    batch = engine.prepare_prefill([Request("r", list(range(1, 21)))])
    try:
        captured.static.fill(batch.forward_batch)
        engine.backend.init_forward_metadata_capture(captured.static)
        pieces = Pieces()
        if mode == "graph":
            pieces.begin_piece()
            model(captured.static.batch, engine.backend)
            pieces.end_piece()
        else:
            run_in_pieces(model, captured.static.batch, engine.backend, pieces, break_gdn=mode == "breakable")
    finally:
        engine.abort_prefill(batch)
    return pieces.n_pieces, len(pieces.breaks)


@exercise(NOTEBOOK, 3, "predict the pieces and breaks of a forward", "my_cut_prediction",
          forbidden=("mamba_edu.serving", "mamba_edu.engine", "mamba_edu.model"))
def check_cut_prediction(fn) -> str:
    """``fn(n_layers, attn_every, mode) -> (pieces, breaks)`` must equal the measured cut exactly."""
    for n_layers, attn_every in CUT_LAYOUTS:
        for mode in CUT_MODES:
            said = fn(n_layers, attn_every, mode)
            if not (isinstance(said, tuple | list) and len(said) == 2
                    and all(map(is_count, said))):
                raise AssertionError(f"the prediction for n_layers = {n_layers}, attn_every = {attn_every}, "
                                     f"mode {mode!r} is {said!r:.60}; expected a tuple of two ints (pieces, breaks)")
            got = measured_cut(n_layers, attn_every, mode)
            if tuple(map(int, said)) != got:
                layout = f"attention every {attn_every}" if attn_every else "no attention (attn_every = 0)"
                raise AssertionError(f"{n_layers} layers, {layout}, mode "
                                     f"{mode!r}: you predicted (pieces, breaks) = {tuple(said)}, the cut measures "
                                     f"{got} (tolerance 0)")
    return (f"your prediction equals the measured (pieces, breaks) for {len(CUT_LAYOUTS)} layouts × "
            f"{len(CUT_MODES)} modes (tolerance 0)")
