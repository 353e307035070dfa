"""Record one prefill forward on every tensor-parallel rank under ``torch.profiler`` (notebook 11).

:func:`record_tp_traces` starts ``world`` ranks with :func:`~mamba_edu.tp.launch.launch`; each
runs :func:`rank_trace_job`: it builds its slice of the seeded model
(:func:`~mamba_edu.tp.build_tp_model`; with one rank, the full
:func:`~mamba_edu.model.build_model` itself, the reference), an
:class:`~mamba_edu.engine.Engine` on it, and records fresh prefills with
:func:`~mamba_edu.profiling.record_trace` (one call skipped, one warm-up, one kept, each inside
the ``prefill_forward`` range). Every rank runs the same prefills, so the collectives pair up.

What a rank's trace holds around a collective (CPU, gloo): our ranges ``tp.all_reduce`` /
``tp.all_gather`` (:data:`COLLECTIVE_RANGES`, on the forward's thread, from the call until the
result is there), inside them the ``c10d::allreduce_`` / ``c10d::allgather_`` operators that hand
the work to the process group, and gloo's own ``gloo:all_reduce`` / ``gloo:all_gather`` ranges on
a gloo worker thread. Both ranks' traces use the same clock (one machine), so they can be drawn
on one time axis.
"""

from __future__ import annotations

from pathlib import Path

#: The ranges :class:`~mamba_edu.tp.model.Collectives` opens around each collective.
COLLECTIVE_RANGES = ("tp.all_reduce", "tp.all_gather")


def trace_name(rank: int, world: int) -> str:
    """The file stem of rank ``rank`` of ``world``'s trace: ``tp2_rank0`` (``tp1_rank0``: the
    1-rank reference)."""
    return f"tp{world}_rank{rank}"


def rank_trace_job(rank: int, world: int, out_dir: str, preset: str = "tiny",
                   strategy: str = "sync_free", lengths: tuple[int, ...] = (130, 62), seed: int = 0,
                   threads: int = 1) -> dict:
    """One rank's recording (a :func:`~mamba_edu.tp.launch.launch` job).

    ``threads``: torch's intra-op threads in this rank (one per rank, so that two ranks on a
    laptop do not fight over its cores). Each recorded call prefills fresh prompts of
    ``lengths`` tokens (random tokens drawn from ``seed``: the same on every rank; no prefix hit).

    Returns ``{"rank", "world", "trace"}``: ``trace`` is the path (a ``str``) of the gzipped
    Chrome trace ``<out_dir>/<trace_name(rank, world)>.json.gz``.
    """
    import torch

    from mamba_edu.engine import Engine
    from mamba_edu.model import build_model
    from mamba_edu.profiling.traces import record_trace
    from mamba_edu.engine.requests import Request
    from mamba_edu.tp.model import build_tp_model

    torch.set_num_threads(threads)
    model = (build_model(preset, device="cpu", seed=seed) if world == 1
             else build_tp_model(preset, rank, world, device="cpu", seed=seed))
    engine = Engine(model, strategy, max_requests=len(lengths))
    gen = torch.Generator().manual_seed(seed)
    state = {"batch": None, "logits": None, "count": 0}

    def close():
        if state["batch"] is not None:
            engine.finish_prefill(state["batch"], state["logits"])
            engine.release(state["batch"].rids)
        state["batch"] = state["logits"] = None

    def setup():
        close()
        state["count"] += 1
        vocab = model.config.vocab
        requests = [Request((state["count"], i), torch.randint(vocab, (n,), generator=gen).tolist())
                    for i, n in enumerate(lengths)]
        state["batch"] = engine.prepare_prefill(requests)
        return state["batch"]

    def forward(batch):
        state["logits"] = engine.forward_prefill(batch)

    rec = record_trace(forward, Path(out_dir), trace_name(rank, world), setup=setup,
                       tensorboard_dir=None)
    close()
    return {"rank": rank, "world": world, "trace": str(rec.chrome_trace)}


def record_tp_traces(world: int, out_dir: str | Path, preset: str = "tiny",
                     strategy: str = "sync_free", lengths: tuple[int, ...] = (130, 62),
                     seed: int = 0, threads: int = 1, timeout: float = 300.0) -> list[dict]:
    """:func:`rank_trace_job` on ``world`` spawned ranks (gloo on the CPU); returns each rank's
    dict, in rank order. Raises :class:`~mamba_edu.tp.launch.RankFailure` when a rank fails."""
    from mamba_edu.tp.launch import launch

    return launch(rank_trace_job, world,
                  (str(out_dir), preset, strategy, tuple(lengths), seed, threads), timeout=timeout)
