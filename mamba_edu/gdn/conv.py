"""Causal depthwise conv1d with conv states (the short convolution before the GDN core).

For one sequence with previous context ``x_prev`` (its last ``W−1`` raw inputs, zeros if none)::

    y[t, c] = silu(bias[c] + Σ_j weight[c, j] · x̃[t + j, c]),   x̃ = concat(x_prev, x)

``weight[:, W−1]`` multiplies the current token. The conv state is the last ``W−1`` *raw*
(pre-conv) input columns, oldest first: ``[N, D, W−1]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mamba_edu.gdn.varlen import check_floating, seq_lengths


def _check_weight(x_dim: int, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != x_dim or weight.shape[1] < 1:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must have shape [D, W] with D={x_dim} and W >= 1; got {shape}")
    if bias is not None and bias.shape != (x_dim,):
        raise ValueError(f"bias must have shape [D]=({x_dim},); got {tuple(bias.shape)}")
    return weight.shape[1]


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation != "silu":
        raise ValueError(f"activation must be 'silu' or None; got {activation!r}")
    return F.silu(y)


def _check_floats(x, weight, bias, state, state_name) -> None:
    """Floating tensors on one device (an integer x would be truncated by the convolution)."""
    for name, t, optional in (("x", x, False), ("weight", weight, False), ("bias", bias, True),
                              (state_name, state, True)):
        check_floating(name, t, optional=optional)
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on {x.device} like x; got {t.device}")


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  cu_seqlens=None, initial_states: torch.Tensor | None = None,
                  activation: str | None = "silu"):
    """Prefill convolution over a packed batch.

    Args:
        x: ``[T, D]`` raw inputs (``mixed_qkv``).  weight: ``[D, W]``.  bias: ``[D]`` or None.
        cu_seqlens: ``[N+1]`` or None (one sequence).
        initial_states: ``[N, D, W−1]`` conv states of sequences continuing a cached prefix
            (zeros = a fresh sequence), or None.
    Returns:
        ``(y [T, D] in x's dtype, final_states [N, D, W−1] in x's dtype)``.
    """
    _check_floats(x, weight, bias, initial_states, "initial_states")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, D]; got shape {tuple(x.shape)}")
    T, D = x.shape
    W = _check_weight(D, weight, bias)
    lengths = seq_lengths(cu_seqlens, T)
    if initial_states is not None and tuple(initial_states.shape) != (len(lengths), D, W - 1):
        raise ValueError(f"initial_states must have shape [N, D, W-1]={(len(lengths), D, W - 1)}; "
                         f"got {tuple(initial_states.shape)}")
    ys, finals = [], []
    start = 0
    for n, length in enumerate(lengths):
        prev = (x.new_zeros(D, W - 1) if initial_states is None else initial_states[n].to(x.dtype))
        ext = torch.cat([prev, x[start:start + length].T], dim=1)  # [D, W-1+L]
        y = F.conv1d(ext.float()[None], weight.float()[:, None, :],
                     None if bias is None else bias.float(), groups=D)[0]  # [D, L]
        ys.append(y.T)
        finals.append(ext[:, ext.shape[1] - (W - 1):])  # the last W−1 columns (none when W = 1)
        start += length
    return _activate(torch.cat(ys), activation).to(x.dtype), torch.stack(finals)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, activation: str | None = "silu"):
    """One decode token per sequence.

    Args: ``x: [N, D]``, ``conv_state: [N, D, W−1]``, weight ``[D, W]``, bias ``[D]``.
    Returns ``(y [N, D], new_state [N, D, W−1])``; the new state drops the oldest column and
    appends ``x``.
    """
    _check_floats(x, weight, bias, conv_state, "conv_state")
    if x.dim() != 2:
        raise ValueError(f"x must be [N, D]; got shape {tuple(x.shape)}")
    N, D = x.shape
    W = _check_weight(D, weight, bias)
    if tuple(conv_state.shape) != (N, D, W - 1):
        raise ValueError(f"conv_state must have shape [N, D, W-1]={(N, D, W - 1)}; "
                         f"got {tuple(conv_state.shape)}")
    window = torch.cat([conv_state.to(x.dtype), x[:, :, None]], dim=2)  # [N, D, W]
    y = (window.float() * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    return _activate(y, activation).to(x.dtype), window[:, :, 1:]
