"""Model shapes and the benchmark presets (docs/conventions.md).

A dense MLP stands in for the mixture of experts: its width is the *active* expert width
(top-k routed experts plus the shared expert), so the FLOPs per token match, not the parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of the hybrid model.

    Layer ``i`` is full attention iff ``attn_every > 0 and (i + 1) % attn_every == 0``
    (Qwen3-Next: layers 3, 7, 11, …); every other layer is a Gated DeltaNet layer.
    ``attn_every = 0`` gives a GDN-only model.
    """

    vocab: int
    hidden: int
    n_layers: int
    attn_every: int
    gdn_key_heads: int      # H
    gdn_value_heads: int    # HV (a multiple of H)
    gdn_key_dim: int        # K
    gdn_value_dim: int      # V
    conv_width: int         # W
    attn_heads: int
    attn_kv_heads: int
    attn_head_dim: int
    mlp_width: int          # dense stand-in for the MoE: active-expert width
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab", "hidden", "n_layers", "gdn_key_heads", "gdn_value_heads", "gdn_key_dim",
                     "gdn_value_dim", "conv_width", "attn_heads", "attn_kv_heads", "attn_head_dim",
                     "mlp_width", "attn_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int (not a bool or float); got {value!r}")
        for name in ("vocab", "hidden", "n_layers", "gdn_key_heads", "gdn_value_heads", "gdn_key_dim",
                     "gdn_value_dim", "attn_heads", "attn_kv_heads", "attn_head_dim", "mlp_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.attn_every < 0:
            raise ValueError(f"attn_every must be >= 0 (0 = no attention); got {self.attn_every}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive finite number; got {value!r}")
        if self.gdn_value_heads % self.gdn_key_heads:
            raise ValueError(f"gdn_value_heads={self.gdn_value_heads} must be a multiple of "
                             f"gdn_key_heads={self.gdn_key_heads}")
        if self.attn_heads % self.attn_kv_heads:
            raise ValueError(f"attn_heads={self.attn_heads} must be a multiple of "
                             f"attn_kv_heads={self.attn_kv_heads}")
        if self.attn_head_dim % 2:
            raise ValueError(f"attn_head_dim must be even (RoPE); got {self.attn_head_dim}")
        if not 2 <= self.conv_width <= 64:
            raise ValueError(f"conv_width must be in [2, 64]; got {self.conv_width}")

    def is_attention(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) is a full-attention layer."""
        return self.attn_every > 0 and (layer + 1) % self.attn_every == 0

    @property
    def gdn_layers(self) -> list[int]:
        """Indices of the GDN layers, in order (pool layer ``j`` belongs to ``gdn_layers[j]``)."""
        return [i for i in range(self.n_layers) if not self.is_attention(i)]

    @property
    def attn_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_attention(i)]

    @property
    def conv_dim(self) -> int:
        """Channels of ``mixed_qkv``, the conv1d input: ``2·H·K + HV·V``."""
        return 2 * self.gdn_key_heads * self.gdn_key_dim + self.gdn_value_heads * self.gdn_value_dim

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed, e.g. ``cfg.replace(n_layers=8)``."""
        return dataclasses.replace(self, **changes)


_QWEN35 = ModelConfig(
    vocab=248320, hidden=4096, n_layers=60, attn_every=4, gdn_key_heads=16, gdn_value_heads=64,
    gdn_key_dim=128, gdn_value_dim=128, conv_width=4, attn_heads=32, attn_kv_heads=2,
    attn_head_dim=256, mlp_width=11 * 1024)  # 10 routed + 1 shared expert of width 1024

PRESETS: dict[str, ModelConfig] = {
    # CPU tests: 4 layers, attention every 4th -> 3 GDN + 1 attention.
    "tiny": ModelConfig(
        vocab=128, hidden=64, n_layers=4, attn_every=4, gdn_key_heads=2, gdn_value_heads=4,
        gdn_key_dim=16, gdn_value_dim=16, conv_width=4, attn_heads=4, attn_kv_heads=2,
        attn_head_dim=16, mlp_width=128),
    # Qwen3-Next-80B-A3B: 36 GDN + 12 attention layers.
    "qwen3-next": ModelConfig(
        vocab=151936, hidden=2048, n_layers=48, attn_every=4, gdn_key_heads=16, gdn_value_heads=32,
        gdn_key_dim=128, gdn_value_dim=128, conv_width=4, attn_heads=16, attn_kv_heads=2,
        attn_head_dim=256, mlp_width=11 * 512),  # 10 routed + 1 shared expert of width 512
    # Qwen3.5-397B-A17B: 45 GDN + 15 attention layers.
    "qwen3.5": _QWEN35,
    # Its per-GPU slice at tensor-parallel 8 (the all-reduce is not simulated).
    "qwen3.5-tp8": _QWEN35.replace(gdn_key_heads=2, gdn_value_heads=8, attn_heads=4, attn_kv_heads=1,
                                   mlp_width=_QWEN35.mlp_width // 8),
}


def get_config(preset: str | ModelConfig, **overrides) -> ModelConfig:
    """The config of a preset name (or a config), with optional field overrides."""
    if isinstance(preset, ModelConfig):
        cfg = preset
    elif preset in PRESETS:
        cfg = PRESETS[preset]
    else:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {preset!r}")
    return cfg.replace(**overrides) if overrides else cfg
