"""The hybrid model: embedding → N × (mixer + MLP, pre-norm residual) → final norm → LM head."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mamba_edu.model.config import ModelConfig, get_config
from mamba_edu.model.layers import KV, MLP, Attention, GDNMixer, RMSNorm, init_param, rope_tables
from mamba_edu.probes import profile_range


class HybridLayer(nn.Module):
    """One pre-norm residual block, as in the paper::

        h   = x + mixer(norm(x))
        out = h + mlp(norm(h))

    The mixer is a GDN layer or full attention. Each residual add is fused into the norm after it
    (:meth:`RMSNorm.fused_add_norm`), which saves a pass over the hidden states (a kernel on a GPU),
    as SGLang fuses the residual add into its RMSNorm. So a layer hands ``out`` on as two terms,
    ``h`` and ``mlp(norm(h))``, and the next layer's first norm (or the final norm) adds them.
    ``rotary``: the forward's rotary tables (:func:`~mamba_edu.model.layers.rope_tables`), used by
    attention layers only.
    """

    def __init__(self, cfg: ModelConfig, index: int, mixer: nn.Module, gen, device, dtype, out_std):
        super().__init__()
        self.index = index
        self.kind = "attn" if isinstance(mixer, Attention) else "gdn"
        self.mixer_norm = RMSNorm(cfg.hidden, cfg.norm_eps, device, dtype)
        self.mixer = mixer
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, device, dtype)
        self.mlp = MLP(cfg, gen, device, dtype, out_std)
        self._mixer_range, self._mlp_range = f"layer{index:02d}.{self.kind}", f"layer{index:02d}.mlp"

    def forward(self, x, mlp_out, batch, backend, rotary):
        """The residual stream is ``x + mlp_out`` (``[T, hidden]`` each; ``mlp_out`` is the
        previous layer's, None in the first layer). Returns ``(h, mlp(norm(h)), kv)``: the next
        layer's ``x`` and ``mlp_out``, and the attention mixer's per-sequence KV (None in a GDN
        layer)."""
        with profile_range(self._mixer_range):
            x, normed = self.mixer_norm.fused_add_norm(x, mlp_out)  # x = x + mlp_out; norm(x)
            if self.kind == "gdn":
                mixer_out, kv = self.mixer(normed, batch, backend), None
            else:
                mixer_out, kv = self.mixer(normed, batch, rotary, backend)
        with profile_range(self._mlp_range):
            h, normed = self.mlp_norm.fused_add_norm(x, mixer_out)  # h = x + mixer(norm(x)); norm(h)
            return h, self.mlp(normed), kv                          # out = h + mlp(norm(h))


class ModelOutput(NamedTuple):
    """What one forward returns.

    ``logits [N, vocab]`` fp32 of the last token of each sequence; ``kv[i][j] = (k, v)``, each
    ``[P_i + E_i, kv_heads, head_dim]``: the full KV of sequence i (cached prefix and new tokens)
    in attention layer j (``kv[i]`` is empty in a model without attention). For a bucket's batch
    (``batch.bucket``), ``kv[j]`` is layer j's ``(k, v)`` over the whole bucket instead
    (:meth:`~mamba_edu.engine.bucket.StaticBucket.results` cuts out each request's).
    """

    logits: torch.Tensor
    kv: list[list[KV]]


def draw_layers(cfg: ModelConfig, gen: torch.Generator, device, dtype, out_std: float):
    """The model's layers in order, each drawn from ``gen`` when it is asked for (one at a time,
    so a caller can shard a layer before the next exists)."""
    n_attn = n_gdn = 0
    for i in range(cfg.n_layers):
        if cfg.is_attention(i):
            mixer, n_attn = Attention(cfg, n_attn, gen, device, dtype, out_std), n_attn + 1
        else:
            mixer, n_gdn = GDNMixer(cfg, n_gdn, gen, device, dtype, out_std), n_gdn + 1
        yield HybridLayer(cfg, i, mixer, gen, device, dtype, out_std)


class HybridModel(nn.Module):
    """Random-weight hybrid GDN + attention model (no downloads), built by :func:`build_model`.

    ``forward(batch, backend) ->`` :class:`ModelOutput` ``(logits [N, vocab], kv)``: fp32 logits
    of the last token of each sequence and each sequence's attention KV.
    ``batch`` is a :class:`mamba_edu.serving.ForwardBatch`; ``backend`` the
    :class:`mamba_edu.serving.LinearAttentionBackend` that owns the state pool.
    """

    def __init__(self, cfg: ModelConfig, device="cpu", dtype=torch.float32, seed: int = 0):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig; got {type(cfg).__name__}")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise ValueError(f"dtype must be a floating torch dtype (torch.float32, torch.bfloat16, "
                             f"torch.float16); got {dtype!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int; got {seed!r}")
        self.config = cfg
        gen = torch.Generator(device=device).manual_seed(seed)
        # Residual scaling: each of the 2·n_layers branches adds variance ~1/(2·n_layers), so the
        # residual stream stays O(1) however deep the model is.
        out_std = (2 * cfg.n_layers) ** -0.5
        self.embed = init_param(gen, (cfg.vocab, cfg.hidden), 1.0, device, dtype)
        self.layers = nn.ModuleList(draw_layers(cfg, gen, device, dtype, out_std))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, device, dtype)
        self.has_attention = bool(cfg.attn_layers)
        self.lm_head = init_param(gen, (cfg.vocab, cfg.hidden), cfg.hidden ** -0.5, device, dtype)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @torch.no_grad()
    def forward(self, batch, backend) -> ModelOutput:
        return run_forward(self, lambda ids: self.embed[ids], batch, backend)


def run_forward(model: nn.Module, embed, batch, backend, gather_logits=None) -> ModelOutput:
    """The forward of :class:`HybridModel` and of a tensor-parallel rank's model: embed, the
    layers, then the final add, norm and LM head on each sequence's last token.

    ``embed(ids [T]) -> [T, hidden]``; ``gather_logits([N, vocab_part]) -> [N, vocab]`` (a rank's
    all-gather; None on one device). ``model`` has ``config``, ``layers``, ``norm``, ``lm_head``
    and ``has_attention``."""
    cfg = model.config
    with profile_range("embed"):
        x = embed(batch.input_ids)
        rotary = (rope_tables(batch.positions, cfg.attn_head_dim, cfg.rope_theta)
                  if model.has_attention else None)
    mlp_out, attn_kv = None, []  # attn_kv[j][i]: attention layer j, sequence i
    for layer in model.layers:
        x, mlp_out, kv = layer(x, mlp_out, batch, backend, rotary)
        if kv is not None:
            attn_kv.append(kv)

    def lm_head():
        rows = batch.last_token_index  # only the last tokens need the last add and the final norm
        _, normed = model.norm.fused_add_norm(x[rows], mlp_out[rows])
        logits = F.linear(normed, model.lm_head).float()
        return logits if gather_logits is None else gather_logits(logits)

    with profile_range("lm_head"):
        logits = backend.logits(lm_head)
    if batch.bucket is not None:  # per layer over the bucket: StaticBucket.results cuts them up
        return ModelOutput(logits, attn_kv)
    return ModelOutput(logits, [[layer_kv[i] for layer_kv in attn_kv] for i in range(batch.size)])


def build_model(preset: str | ModelConfig = "tiny", device=None, dtype=torch.float32, seed: int = 0,
                **overrides) -> HybridModel:
    """A seeded random-weight model of a preset (``tiny``, ``qwen3-next``, ``qwen3.5``,
    ``qwen3.5-tp8``), optionally with config overrides, e.g. ``n_layers=8`` or ``attn_every=0``.

    ``device=None`` picks CUDA when present.
    """
    from mamba_edu._runtime import default_device

    cfg = get_config(preset, **overrides)
    return HybridModel(cfg, device=default_device() if device is None else torch.device(device),
                       dtype=dtype, seed=seed).eval()


def weight_bytes(preset: str | ModelConfig, dtype=torch.float32, **overrides) -> int:
    """Bytes of a preset's weights at ``dtype``, counted on a model built without memory
    (``FakeTensorMode``: shapes, no data), so that a command can refuse a model that does not
    fit before it allocates anything."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        model = build_model(preset, device="cpu", dtype=dtype, **overrides)
        return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
