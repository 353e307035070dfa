"""Checks of notebook 02 (chunked prefill).

1. ``my_unit_lower_inverse`` — ``T = (I + L)⁻¹`` by forward substitution, without ``torch.linalg``.
2. ``my_checkpoint_row`` — which row of the checkpoint tensor holds a sequence's state after a
   number of tokens, if any.
3. ``my_chunk`` — one chunk of the chunked pass in the WY form: ``(O, S_next)`` from ``S₀``.
"""

from __future__ import annotations

import torch

from mamba_edu.exercises.core import check_seed, checker, exercise, observe
from mamba_edu.gdn import (checkpoint_offsets, chunk_gated_delta_rule, cu_offsets, gdn_gating, l2norm,
                           recurrent_gated_delta_rule)
from mamba_edu.testing import check as _check

NOTEBOOK = "02_chunked_prefill"
check = checker(NOTEBOOK)


def compare(actual, expected, name: str, tol: float = 1e-5) -> None:
    """:func:`mamba_edu.testing.check` without its printed line and its ``FAIL`` prefix (the
    verdict line says FAIL already)."""
    try:
        _check(actual, expected, tol=tol, name=name, quiet=True)
    except AssertionError as err:
        raise AssertionError(str(err).removeprefix("FAIL ")) from None



def _chunk_L(gen: torch.Generator, C: int, decay: float, spread: float | None = None,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A strictly lower ``L [C, C]`` as a chunk makes it: unit keys, cumulative decay, write
    strengths. ``spread``: the keys are one direction plus that much noise (correlated keys, as
    in real text: the entries of ``L`` near 1, where a truncated series is far off); ``None``:
    independent random keys."""
    k = torch.randn(C, 16, generator=gen)
    if spread is not None:
        k = torch.randn(1, 16, generator=gen) + spread * k
    k = torch.nn.functional.normalize(k, dim=-1)
    gamma = (-decay * torch.rand(C, generator=gen)).cumsum(0)
    beta = torch.rand(C, generator=gen)
    below = torch.ones(C, C, dtype=torch.bool).tril(-1)
    L = beta[:, None] * (k @ k.T) * (gamma[:, None] - gamma[None, :]).masked_fill(~below, float("-inf")).exp()
    return L.to(dtype)


#: Exercise 1's cases: (C, decay, key spread or None, dtype, tolerance). A bf16 ``L`` wants a bf16
#: ``T`` (the answer is dtype-generic); its rounding allows a looser tolerance.
_INVERSE_CASES = ((1, 0.1, None, torch.float32, 1e-5), (7, 0.1, None, torch.float32, 1e-5),
                  (64, 0.02, None, torch.float32, 1e-5), (64, 1.0, None, torch.float32, 1e-5),
                  (64, 0.02, 0.1, torch.float32, 1e-5), (32, 0.1, None, torch.bfloat16, 2e-2))


@exercise(NOTEBOOK, 1, "the triangular inverse by hand", "my_unit_lower_inverse",
          forbidden=("mamba_edu.gdn.chunked", "mamba_edu.kernels", "torch.linalg", "torch.inverse",
                     "torch.triangular_solve", "numpy.linalg", "scipy.linalg"))
def check_unit_lower_inverse(fn) -> str:
    """Chunk-like ``L`` (C = 1, 7 and 64; slow and fast decay; correlated keys; a bf16 ``L``);
    compare with a triangular solve in float64."""
    gen = torch.Generator().manual_seed(check_seed(3))
    for C, decay, spread, dtype, tol in _INVERSE_CASES:
        L = _chunk_L(gen, C, decay, spread, dtype)
        seen = observe(fn, L.clone())
        T = seen.result
        # the grader makes these ops absent in every thread; a check run in the notebook finds them here
        solvers = {op for op in seen.ops if op.startswith("linalg_") or op in ("triangular_solve", "inverse")}
        if solvers:
            raise AssertionError(f"the answer calls {', '.join(sorted(solvers))}: do the forward "
                                 "substitution yourself, one row at a time")
        eye = torch.eye(C, dtype=torch.float64)
        expected = torch.linalg.solve_triangular(eye + L.double(), eye, upper=False, unitriangular=True)
        if isinstance(T, torch.Tensor) and T.dtype != L.dtype:
            raise AssertionError(f"T has dtype {T.dtype}; expected {L.dtype}, the dtype of L")
        keys = "correlated keys" if spread is not None else "random keys"
        compare(T, expected, tol=tol, name=f"T = (I + L)⁻¹ for C={C}, {keys}, {str(dtype)[6:]}")
    return "(I + L)·T = I for chunk sizes 1, 7 and 64, without torch.linalg"


def packed_checkpoints(lengths: list[int], H: int, HV: int, K: int, V: int, *, seed: int):
    """A random packed batch (mild decays) through the chunked GDN with checkpoints and the q/k
    L2 norm: returns ``((q, k, v, g, beta), cu_seqlens as host ints, checkpoints)``."""
    gen = torch.Generator().manual_seed(check_seed(seed))
    T = sum(lengths)
    q, k = torch.randn(2, T, H, K, generator=gen)
    v = torch.randn(T, HV, V, generator=gen)
    g, beta = -torch.rand(T, HV, generator=gen) * 0.1, torch.rand(T, HV, generator=gen)
    cu = cu_offsets(lengths)
    ckpts = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor(cu), use_qk_l2norm=True,
                                   output_checkpoints=True).checkpoints
    return (q, k, v, g, beta), cu, ckpts


def _token_counts(length: int, gen: torch.Generator) -> list[int]:
    """The prefixes of a sequence worth asking about: 0, 1, its length, each side of every chunk
    boundary, and three drawn at random (each question is a round trip to the learner's kernel)."""
    edges = {c + d for c in range(64, length + 1, 64) for d in (-1, 0, 1)}
    drawn = torch.randint(0, length + 1, (3,), generator=gen).tolist()
    return sorted(t for t in edges | {0, 1, length, *drawn} if 0 <= t <= length)


@exercise(NOTEBOOK, 2, "find a checkpoint row", "my_checkpoint_row",
          forbidden=("mamba_edu.gdn.varlen.checkpoint_offsets", "mamba_edu.kernels"))
def check_checkpoint_row(fn) -> str:
    """Ask ``fn`` for (sequence, token count) pairs of packed batches: every chunk boundary and its
    neighbours, the ends, and a few drawn at random. The checkpoint tensor of a real run decides:
    every row named must hold the recurrence's state after that many tokens, and ``None`` is
    right exactly where no row holds it. Sequences whose length is a multiple of
    64 come before others (where ``L // 64 + 1`` rows per sequence shifts every later row), and
    a row must be a Python ``int``. The rows held are worked out after the answers."""
    for seed, lengths in enumerate(([70, 5, 130, 64], [64, 128, 3, 65, 1])):
        gen = torch.Generator().manual_seed(check_seed(20 + seed))
        asked = [(n, tokens) for n, length in enumerate(lengths) for tokens in _token_counts(length, gen)]
        answers = [fn(list(lengths), n, tokens) for n, tokens in asked]
        (q, k, v, g, beta), cu, ckpts = packed_checkpoints(lengths, 1, 1, 4, 4, seed=4 + seed)
        # What the run holds: rows offsets[n] … offsets[n+1]-1 are the states after 0, 64, 128, … tokens.
        offsets = checkpoint_offsets(lengths)
        held = {(n, 64 * j): offsets[n] + j for n in range(len(lengths))
                for j in range(offsets[n + 1] - offsets[n])}
        for (n, tokens), row in zip(asked, answers):
            start, expected = int(cu[n]), held.get((n, tokens))
            if row is not None and type(row) is not int:
                raise AssertionError(f"my_checkpoint_row({lengths}, n={n}, tokens={tokens}) returned "
                                     f"a {type(row).__name__}; expected an int or None")
            if row != expected:
                raise AssertionError(f"my_checkpoint_row({lengths}, n={n}, tokens={tokens}) = {row!r}; "
                                     f"expected {expected!r}")
            if row is not None and tokens > 0:
                sl = slice(start, start + tokens)
                state = recurrent_gated_delta_rule(q[sl], k[sl], v[sl], g[sl], beta[sl],
                                                   use_qk_l2norm=True).final_state[0]
                compare(ckpts[row], state, name=f"checkpoint row {row}")
    return "the right row (or None) at every chunk edge, both ends and random prefixes of two packed batches"


@exercise(NOTEBOOK, 3, "one chunk of the chunked pass", "my_chunk",
          forbidden=("mamba_edu.gdn.chunked", "mamba_edu.gdn.recurrent", "mamba_edu.kernels"))
def check_chunk(fn) -> str:
    """Chunks of 64 tokens with slow and with strong gates (where an exponential taken before the
    mask overflows), a partial chunk of 23 tokens, and 16 tokens with gates so weak that the
    entering state still counts at the chunk's end, each from a random entering state;
    outputs and leaving state against the package's token-by-token recurrence."""
    gen = torch.Generator().manual_seed(check_seed(5))
    K, V = 16, 8
    for C, A_log in ((64, -1.0), (64, 3.0), (23, 1.0), (16, -4.0)):  # the last: S0 still counts at the end
        q, k = l2norm(torch.randn(2, C, K, generator=gen))
        v = torch.randn(C, V, generator=gen)
        g, beta = gdn_gating(torch.tensor([A_log]), torch.randn(C, 1, generator=gen),
                             torch.randn(C, 1, generator=gen), torch.zeros(1))
        g, beta = g[:, 0], beta[:, 0]
        S0 = torch.randn(K, V, generator=gen)
        scale = K ** -0.5
        result = observe(fn, q, k, v, g, beta, S0, scale).result  # observe: the inputs come back unchanged
        ref = recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                         scale=scale, initial_state=S0[None, None])
        if not (isinstance(result, tuple) and len(result) == 2):
            raise AssertionError(f"my_chunk returned {type(result).__name__}; expected a tuple (O, S_next)")
        O, S_next = result
        where = f"C={C}, A_log={A_log:+.0f}"
        for t, name in ((O, "O"), (S_next, "S_next")):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                raise AssertionError(f"{name} ({where}) is {getattr(t, 'dtype', type(t).__name__)}; "
                                     "expected a torch.float32 tensor")
        compare(O, ref.o[:, 0], name=f"O ({where})")
        compare(S_next, ref.final_state[0, 0], name=f"S_next ({where})")
    return "O and S_next match the recurrence: weak, slow and strong gates, partial chunks"
