"""The tensor-parallel check that ``demo --tp N`` prints: N ranks against the 1-rank model.

Every rank builds its slice with :func:`~mamba_edu.tp.build_tp_model` (one layer at a time)
and, as the reference, the full 1-rank model of the same seed (:func:`~mamba_edu.model.build_model`;
small presets only: it must fit on one device). Per strategy both run the same scenario
(:func:`scenario`) on an :class:`~mamba_edu.engine.Engine` each:

1. a prefill of fresh prompts (long ones tracked, one too short to be);
2. a prefill of prompts that extend the first ones (prefix hits on their tracked snapshots) and a
   fresh one;
3. ``decode_steps`` greedy decode steps of every request (one crosses a ``track_interval``
   boundary, so decode tracking copies a snapshot too).

Compared after each phase: the logits (full vocabulary: all-gathered), this rank's pool against
its head slice of the 1-rank pool (every slot but the scratch slot, so the tracked snapshots and
the working states), the snapshots the cache holds, the prefix lengths and track positions, the
decoded tokens; and the decisions (prefix lengths, track positions, cache entries, slots,
tokens) gathered from every rank, which must be the same everywhere: the engine is
deterministic, so every rank plans alike with no broadcast. Syncs per prefill forward are
counted on every rank (:func:`~mamba_edu.profiling.count_syncs`) beside the 1-rank ones.

Tolerance: fp32 throughout; a row-parallel projection sums the ranks' partial products where the
1-rank model does one GEMM (another summation order), so results agree to rounding, not bit for
bit: :data:`TOL` relative error (norm-wise, :func:`~mamba_edu.testing.rel_err`). Decisions and
tokens must be equal.
"""

from __future__ import annotations

import time

import torch

#: Largest relative error accepted (fp32): CPU; CUDA (tf32 products in the attention kernel).
TOL = {"cpu": 1e-5, "cuda": 2e-3}
DEFAULT_LENGTHS = (130, 200, 62)


def scenario(lengths, vocab: int, seed: int, cache_chunk: int = 64):
    """The two prefill batches, each a list of ``(rid, tokens)``: ``lengths`` fresh prompts,
    then every prompt of at least ``2·cache_chunk`` tokens extended (a hit on its tracked
    snapshot; the longest by more than ``cache_chunk``, so it is tracked again) and one fresh
    prompt of ``cache_chunk + 6`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(vocab, (n,), generator=gen).tolist()  # noqa: E731
    first = [(f"a{i}", rand(n)) for i, n in enumerate(lengths)]
    longest = max(range(len(lengths)), key=lambda i: lengths[i])
    second = [(f"b{i}", tokens + rand(cache_chunk + 6 if i == longest else 10))
              for i, (_, tokens) in enumerate(first) if len(tokens) >= 2 * cache_chunk]
    second.append(("fresh", rand(cache_chunk + 6)))
    return [first, second]


def _cache_entries(cache) -> list[tuple[int, int]]:
    """``(prefix length, slot)`` of every snapshot the cache holds, sorted."""
    out, stack = [], [(cache.root, 0)]
    while stack:
        node, depth = stack.pop()
        depth += len(node.tokens)
        if node.slot is not None:
            out.append((depth, node.slot))
        stack.extend((c, depth) for c in node.children.values())
    return sorted(out)


def run_scenario(engine, batches, decode_steps: int) -> dict:
    """The scenario on ``engine``: per phase the logits, the pool (cloned), prefix lengths, track
    positions, syncs and ms of the prefill forward; then the decisions (host values only)."""
    from mamba_edu.profiling import count_syncs
    from mamba_edu.engine.requests import Request

    phases, pool = [], engine.pool
    for prompts in batches:
        batch = engine.prepare_prefill([Request(rid, tokens) for rid, tokens in prompts])
        with count_syncs() as syncs:
            start = time.perf_counter()
            logits = engine.forward_prefill(batch)
            ms = (time.perf_counter() - start) * 1e3
        engine.finish_prefill(batch, logits)
        fb = batch.forward_batch
        phases.append(dict(logits=logits.clone(), conv=pool.conv.clone(), ssm=pool.ssm.clone(),
                           prefix_lens=list(fb.prefix_lens), track_lens=list(fb.track_lens),
                           syncs=syncs.count, ms=ms))
    dec = engine.decode(decode_steps)
    phases.append(dict(logits=dec.logits.clone(), conv=pool.conv.clone(), ssm=pool.ssm.clone()))
    decisions = dict(
        prefix_lens=[p.get("prefix_lens") for p in phases[:-1]],
        track_lens=[p.get("track_lens") for p in phases[:-1]],
        cache=_cache_entries(engine.cache),
        slots=sorted((str(r.rid), r.working_slot, tuple(r.track_slots)) for r in engine.running.values()),
        tokens={str(rid): toks for rid, toks in dec.tokens.items()},
        prefix_hits=engine.stats.prefix_hits, cached_tokens=engine.stats.cached_tokens)
    return dict(phases=phases, decisions=decisions)


def _inject_failure(model, rank: int, layer: int, how: str = "raise") -> None:
    """Test hook: layer ``layer``'s mixer fails on this rank, mid-forward (before its
    all-reduce): ``how="raise"`` raises; ``"hang"`` never returns (a stuck rank)."""
    mixer = model.layers[layer].mixer

    def fail(*args, **kwargs):
        while how == "hang":
            time.sleep(1.0)
        raise RuntimeError(f"injected failure on rank {rank} in layer {layer} (test hook)")
    mixer.forward = fail


def rank_job(rank: int, world: int, preset="tiny", lengths=DEFAULT_LENGTHS, seed: int = 0,
             decode_steps: int = 4, strategies=None, fail=None) -> list[dict]:
    """One rank's check (run by :func:`~mamba_edu.tp.launch.launch`): a row per strategy with
    the errors against the 1-rank model, the decisions compared, and the syncs. ``fail =
    (rank, layer[, "raise" | "hang"])``: that rank's layer fails in the first TP forward (the
    failure tests)."""
    import torch.distributed as dist

    from mamba_edu.engine import Engine
    from mamba_edu.model import build_model
    from mamba_edu.serving import STRATEGIES
    from mamba_edu.testing import rel_err
    from mamba_edu.tp.model import build_tp_model

    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
    full = build_model(preset, device=device, dtype=torch.float32, seed=seed)
    model = build_tp_model(preset, rank, world, device=device, dtype=torch.float32, seed=seed)
    if fail is not None and fail[0] == rank:
        _inject_failure(model, *fail)
    channels = model.shapes.conv_channels(full.config).to(device)
    heads = model.shapes.value_head_range()
    batches = scenario(lengths, full.config.vocab, seed)
    kw = dict(max_requests=sum(len(b) for b in batches), track_interval=64)
    rows = []
    for strategy in strategies or STRATEGIES:
        ref = run_scenario(Engine(full, strategy=strategy, **kw), batches, decode_steps)
        got = run_scenario(Engine(model, strategy=strategy, **kw), batches, decode_steps)
        errs = {"logits": 0.0, "conv": 0.0, "ssm": 0.0}
        for r, g in zip(ref["phases"], got["phases"]):
            errs["logits"] = max(errs["logits"], rel_err(g["logits"], r["logits"]))
            errs["conv"] = max(errs["conv"], rel_err(g["conv"][:, 1:], r["conv"][:, 1:, channels]))
            errs["ssm"] = max(errs["ssm"], rel_err(g["ssm"][:, 1:], r["ssm"][:, 1:, heads]))
        snaps = [slot for _, slot in got["decisions"]["cache"]]
        last_r, last_g = ref["phases"][-1], got["phases"][-1]
        snap_err = max([rel_err(last_g["ssm"][:, snaps], last_r["ssm"][:, snaps, heads]),
                        rel_err(last_g["conv"][:, snaps], last_r["conv"][:, snaps][:, :, channels])]
                       if snaps else [0.0])
        everyone = [None] * world
        dist.all_gather_object(everyone, got["decisions"])
        rows.append(dict(
            strategy=strategy, rank=rank, errs=errs, snapshot_err=snap_err, snapshots=len(snaps),
            decisions=got["decisions"], same_as_1_rank=got["decisions"] == ref["decisions"],
            same_on_every_rank=all(d == everyone[0] for d in everyone),
            syncs_1_rank=[p["syncs"] for p in ref["phases"][:-1]],
            syncs=[p["syncs"] for p in got["phases"][:-1]],
            ms_1_rank=[p["ms"] for p in ref["phases"][:-1]], ms=[p["ms"] for p in got["phases"][:-1]]))
    return rows


def row_ok(row: dict, tol: float) -> bool:
    """Errors within ``tol`` (NaN fails), decisions equal to the 1-rank ones and on every rank."""
    errs = [*row["errs"].values(), row["snapshot_err"]]
    return all(e <= tol for e in errs) and row["same_as_1_rank"] and row["same_on_every_rank"]


def run_check(world: int, device_type: str = "cpu", preset="tiny", lengths=DEFAULT_LENGTHS,
              seed: int = 0, decode_steps: int = 4, strategies=None, fail=None,
              timeout: float = 300.0, collective_timeout: float = 60.0,
              grace: float | None = None) -> list[list[dict]]:
    """:func:`rank_job` on ``world`` spawned ranks; ``result[rank][i]`` is rank ``rank``'s row of
    strategy ``i``. Raises :class:`~mamba_edu.tp.launch.RankFailure` when a rank fails."""
    from mamba_edu.tp.launch import launch

    return launch(rank_job, world, (preset, tuple(lengths), seed, decode_steps, strategies, fail),
                  device_type=device_type, timeout=timeout, collective_timeout=collective_timeout,
                  grace=grace)


def report(world: int, device_type: str = "cpu", preset: str = "tiny", lengths=DEFAULT_LENGTHS,
           seed: int = 0, decode_steps: int = 4, timeout: float = 600.0,
           collective_timeout: float = 60.0) -> int:
    """Run the check and print it (``demo --tp N``); returns the exit code: 0 PASS, 1 FAIL."""
    from mamba_edu.tp.launch import RankFailure, backend_for

    def say(*a):
        print(*a, flush=True)

    say(f"mamba_edu demo --tp {world}: {world} ranks ({backend_for(device_type)} on {device_type}) "
        f"against the 1-rank model, preset {preset!r}, fp32")
    say(f"   scenario per strategy: prefill of prompts {list(lengths)}; prefill of extended prompts "
        f"(prefix hits) and a fresh one; {decode_steps} decode steps of all of them")
    start = time.perf_counter()
    try:
        ranks = run_check(world, device_type, preset, lengths, seed, decode_steps,
                          timeout=timeout, collective_timeout=collective_timeout)
    except RankFailure as e:
        say(f"\nFAIL: {e}")
        return 1
    seconds = time.perf_counter() - start
    tol = TOL[device_type]
    say(f"   {'strategy':<12} {'logits':>8} {'conv':>8} {'ssm':>8} {'snapshots':>9}  "
        f"{'prefix lens (2nd prefill)':<26} {'decisions':<22} {'syncs/prefill 1-rank | per rank'}")
    ok = True
    for rows in zip(*ranks):
        worst = max(rows, key=lambda r: max(*r["errs"].values(), r["snapshot_err"]))
        good = all(row_ok(r, tol) for r in rows)
        ok &= good
        d = rows[0]["decisions"]
        decisions = ("same as 1-rank" if all(r["same_as_1_rank"] for r in rows) else "DIFFER from 1-rank")
        if not all(r["same_on_every_rank"] for r in rows):
            decisions += ", DIFFER across ranks"
        syncs = f"{rows[0]['syncs_1_rank']} | " + " ".join(str(r["syncs"]) for r in rows)
        e = worst["errs"]
        say(f"   {rows[0]['strategy']:<12} {e['logits']:>8.1e} {e['conv']:>8.1e} {e['ssm']:>8.1e} "
            f"{rows[0]['snapshots']:>4} {'ok' if worst['snapshot_err'] <= tol else 'BAD':<4}  "
            f"{str(d['prefix_lens'][1]):<26} {decisions:<22} {syncs}")
    say(f"   errors: max relative error over ranks and phases (tolerance {tol:.0e}: fp32, the "
        "all-reduce sums in another order); syncs per prefill forward (fresh, then with hits)")
    say(f"   {world} ranks x {len(ranks[0])} strategies in {seconds:.1f} s (spawn and imports "
        f"included); {len(ranks[0][0]['decisions']['slots'])} requests, "
        f"{ranks[0][0]['decisions']['prefix_hits']} prefix hits per run on every rank")
    say(f"\nPASS: the {world}-rank forward matches the 1-rank model (logits, pools, tracked snapshots, "
        "prefix hits, decode after prefill) for every strategy, with the same decisions on every rank"
        if ok else f"\nFAIL: the {world}-rank run differs from the 1-rank model: see the table above")
    return 0 if ok else 1
