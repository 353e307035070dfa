"""The tensor-parallel model: one rank's slice of the seeded full model, with its collectives.

Where the collectives fall (``r`` = this rank, ``N`` = ranks; SGLang's layout)::

    embed      vocab-parallel: rows [r·vocab/N, (r+1)·vocab/N); other ids give 0  -> all-reduce
    per layer  GDN   in-projection column-parallel (this rank's q/k/v/z/b/a heads); conv, core,
                     output norm and the state pool on this rank's heads only;
                     out-projection row-parallel                                   -> all-reduce
               attn  QKV column-parallel (this rank's query heads, its KV heads); attention;
                     out-projection row-parallel                                   -> all-reduce
               MLP   gate/up column-parallel, down row-parallel                    -> all-reduce
    LM head    vocab-parallel: this rank's logit columns                           -> all-gather

So two all-reduces per layer, one for the embedding and one all-gather for the logits. Heads are
split in contiguous blocks. Key heads (GDN ``H``, attention ``kv_heads``) fewer than the ranks
are **replicated**, as SGLang does: each rank keeps the one key head its value (query) heads
read, since value head ``i`` reads key head ``i // (HV/H)`` (query head ``h`` reads KV head
``h // (heads/kv_heads)``). Value heads (and so the recurrent states) are always split.

A rank's :class:`TPHybridModel` has the same forward signature and output as
:class:`~mamba_edu.model.HybridModel`: ``ModelOutput(logits [N, vocab] fp32, kv)``, with the
full-vocabulary logits (the same on every rank after the all-gather) and this rank's KV heads in
``kv``. Its ``config`` is :func:`tp_config`: this rank's head counts and MLP width, the full
vocabulary and hidden size, so an :class:`~mamba_edu.engine.Engine` built on it sizes its state
pool for this rank's heads and checks token ids against the whole vocabulary.

**Same decisions on every rank.** The engine's planning (prefix match, slots, track positions,
evictions, decode tracking) depends only on the requests and on the engine's own history, never
on tensor values, and decode feeds ``argmax`` of the all-gathered logits, which are bitwise the
same on every rank. So N engines given the same calls make the same decisions, with no broadcast;
``tests/tp/test_tp.py`` gathers them from every rank and compares.

**Numerics.** A row-parallel projection sums N partial products where the 1-rank model does one
GEMM over the full width: the same sum in another order, so fp32 results differ in the last bits
(about 1e-7 relative per layer) and not more. The embedding's all-reduce adds exact zeros and the
LM head's all-gather copies: both exact.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from mamba_edu.model.config import ModelConfig, get_config
from mamba_edu.model.hybrid import HybridLayer, HybridModel, ModelOutput, draw_layers, run_forward
from mamba_edu.model.layers import MLP, Attention, GDNMixer, RMSNorm, init_param
from mamba_edu.probes import profile_range


# ---- shapes -------------------------------------------------------------------------------

def _fits(n: int, world: int, replicable: bool) -> bool:
    return n % world == 0 or (replicable and world % n == 0)


def check_tp(cfg: ModelConfig, world) -> list[str]:
    """Why ``world`` ranks cannot split ``cfg``: a list of reasons, empty when they can.

    Value heads, query heads, the MLP width and the vocabulary must divide by ``world``; key
    heads (GDN ``H``, attention ``kv_heads``) must divide by it or divide it (then replicated)."""
    if type(world) is not int or world < 1:
        return [f"the number of ranks must be an int >= 1; got {world!r}"]
    reasons = []
    for present, heads, key_heads in (
            (cfg.gdn_layers, ("GDN value heads", cfg.gdn_value_heads), ("GDN key heads", cfg.gdn_key_heads)),
            (cfg.attn_layers, ("attention heads", cfg.attn_heads), ("attention KV heads", cfg.attn_kv_heads))):
        if not present:
            continue
        if heads[1] % world:
            reasons.append(f"{heads[0]} ({heads[1]}) do not split into {world}")
        if not _fits(key_heads[1], world, True):
            reasons.append(f"{key_heads[0]} ({key_heads[1]}) neither split into {world} nor divide it "
                           f"(to be replicated)")
    if cfg.mlp_width % world:
        reasons.append(f"the MLP width ({cfg.mlp_width}) does not split into {world}")
    if cfg.vocab % world:
        reasons.append(f"the vocabulary ({cfg.vocab}) does not split into {world}")
    return reasons


def _require(cfg: ModelConfig, world) -> None:
    reasons = check_tp(cfg, world)
    if reasons:
        raise ValueError(f"tensor parallelism over {world} ranks does not fit this model: "
                         + "; ".join(reasons))


def _block(n: int, rank: int, world: int) -> tuple[int, int]:
    """``(start, count)`` of rank ``rank``'s block of ``n`` heads: split, or one replicated head."""
    if n % world == 0:
        return rank * (n // world), n // world
    return rank * n // world, 1  # fewer heads than ranks: rank r keeps head r·n/N


@dataclass(frozen=True)
class TPShapes:
    """Rank ``rank`` of ``world``'s blocks of the full model, each ``(start, count)``."""

    rank: int
    world: int
    key_heads: tuple[int, int]
    value_heads: tuple[int, int]
    attn_heads: tuple[int, int]
    attn_kv_heads: tuple[int, int]
    mlp: tuple[int, int]
    vocab: tuple[int, int]

    @classmethod
    def of(cls, cfg: ModelConfig, rank: int, world: int) -> TPShapes:
        _require(cfg, world)
        if type(rank) is not int or not 0 <= rank < world:
            raise ValueError(f"rank must be an int in [0, {world}); got {rank!r}")
        return cls(rank, world, _block(cfg.gdn_key_heads, rank, world),
                   _block(cfg.gdn_value_heads, rank, world), _block(cfg.attn_heads, rank, world),
                   _block(cfg.attn_kv_heads, rank, world), _block(cfg.mlp_width, rank, world),
                   _block(cfg.vocab, rank, world))

    def conv_channels(self, cfg: ModelConfig) -> torch.Tensor:
        """This rank's channels of the full ``mixed_qkv`` (``[q | k | v]``): also its rows of a
        pool's conv states, ``pool.conv[:, :, channels]``."""
        K, V, HK = cfg.gdn_key_dim, cfg.gdn_value_dim, cfg.gdn_key_heads * cfg.gdn_key_dim
        (hs, hn), (vs, vn) = self.key_heads, self.value_heads
        return torch.cat([torch.arange(hs * K, (hs + hn) * K), HK + torch.arange(hs * K, (hs + hn) * K),
                          2 * HK + torch.arange(vs * V, (vs + vn) * V)])

    def value_head_range(self) -> slice:
        """This rank's value heads: its rows of a pool's SSM states, ``pool.ssm[:, :, heads]``."""
        return slice(self.value_heads[0], self.value_heads[0] + self.value_heads[1])


def tp_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """One rank's config: its head counts and MLP width; vocabulary, hidden size and the rest are
    the full model's (the logits a rank returns are all-gathered)."""
    s = TPShapes.of(cfg, 0, world)
    return cfg.replace(gdn_key_heads=s.key_heads[1], gdn_value_heads=s.value_heads[1],
                       attn_heads=s.attn_heads[1], attn_kv_heads=s.attn_kv_heads[1],
                       mlp_width=s.mlp[1])


# ---- collectives ----------------------------------------------------------------------------

class Collectives:
    """The two collectives of the forward on a process group (``torch.distributed``); with one
    rank both are the identity and no process group is needed."""

    def __init__(self, world: int, group=None):
        self.world, self.group = world, group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        if self.world > 1:
            import torch.distributed as dist

            with profile_range("tp.all_reduce"):
                dist.all_reduce(x, group=self.group)
        return x

    def all_gather_cols(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, n]`` per rank → ``[N, world·n]``: the ranks' blocks side by side, in rank order."""
        if self.world == 1:
            return x
        import torch.distributed as dist

        with profile_range("tp.all_gather"):
            parts = [torch.empty_like(x) for _ in range(self.world)]
            dist.all_gather(parts, x.contiguous(), group=self.group)
            return torch.cat(parts, -1)


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone().contiguous(), requires_grad=False)


def _rows(start: int, count: int, width: int, offset: int = 0) -> torch.Tensor:
    """Rows ``offset + [start·width, (start+count)·width)``: heads ``start..start+count`` of a
    projection block whose heads are ``width`` rows each."""
    return offset + torch.arange(start * width, (start + count) * width)


# ---- the layers ---------------------------------------------------------------------------

class TPGDNMixer(GDNMixer):
    """One rank's GDN layer: its key heads (split, or one replicated), its value heads; the
    in-projection column-parallel, the out-projection row-parallel then all-reduced. The backend
    reads its parameters as it reads a :class:`GDNMixer`'s (:class:`~mamba_edu.serving.GDNLayerParams`)."""

    def __init__(self, full: GDNMixer, shapes: TPShapes, comm: Collectives):
        nn.Module.__init__(self)
        (hs, hn), (vs, vn) = shapes.key_heads, shapes.value_heads
        H, HV, K, V = full.key_heads, full.value_heads, full.key_dim, full.value_dim
        self.gdn_index, self.norm_eps, self.comm = full.gdn_index, full.norm_eps, comm
        self.key_heads, self.value_heads, self.key_dim, self.value_dim = hn, vn, K, V
        self.conv_dim = 2 * hn * K + vn * V
        D = full.conv_dim
        mixed = torch.cat([_rows(hs, hn, K), _rows(hs, hn, K, H * K), _rows(vs, vn, V, 2 * H * K)])
        # in_proj rows: [mixed_qkv (D) | z (HV·V) | b (HV) | a (HV)]
        rows = torch.cat([mixed, _rows(vs, vn, V, D), _rows(vs, vn, 1, D + HV * V),
                          _rows(vs, vn, 1, D + HV * V + HV)]).to(full.in_proj.device)
        mixed = mixed.to(full.in_proj.device)
        self.in_proj = _param(full.in_proj[rows])
        self.conv_weight = _param(full.conv_weight[mixed])
        self.conv_bias = _param(full.conv_bias[mixed])
        self.A_log = _param(full.A_log[vs:vs + vn])
        self.dt_bias = _param(full.dt_bias[vs:vs + vn])
        self.norm_weight = _param(full.norm_weight)  # per value head, shared by all heads
        self.out = _param(full.out[:, vs * V:(vs + vn) * V])

    def forward(self, x: torch.Tensor, batch, backend) -> torch.Tensor:
        return self.comm.all_reduce(super().forward(x, batch, backend))


class TPAttention(Attention):
    """One rank's attention layer: its query heads, its KV heads (split, or one replicated);
    QKV column-parallel, the out-projection row-parallel then all-reduced. The KV it returns (and
    the prefix cache keeps) is this rank's KV heads."""

    def __init__(self, full: Attention, shapes: TPShapes, comm: Collectives):
        nn.Module.__init__(self)
        (qs, qn), (ks, kn) = shapes.attn_heads, shapes.attn_kv_heads
        D, A, KVH = full.head_dim, full.heads, full.kv_heads
        self.attn_index, self.comm = full.attn_index, comm
        self.heads, self.kv_heads, self.head_dim = qn, kn, D
        rows = torch.cat([_rows(qs, qn, D), _rows(ks, kn, D, A * D),
                          _rows(ks, kn, D, (A + KVH) * D)]).to(full.qkv.device)
        self.qkv = _param(full.qkv[rows])
        self.out = _param(full.out[:, qs * D:(qs + qn) * D])

    def forward(self, x: torch.Tensor, batch, rotary, backend):
        o, kv = super().forward(x, batch, rotary, backend)
        return self.comm.all_reduce(o), kv


class TPMLP(MLP):
    """One rank's MLP: its block of the width; gate/up column-parallel, down row-parallel then
    all-reduced."""

    def __init__(self, full: MLP, shapes: TPShapes, comm: Collectives):
        nn.Module.__init__(self)
        (ms, mn), M = shapes.mlp, full.down.shape[1]
        rows = torch.cat([_rows(ms, mn, 1), _rows(ms, mn, 1, M)]).to(full.gate_up.device)
        self.comm = comm
        self.gate_up = _param(full.gate_up[rows])
        self.down = _param(full.down[:, ms:ms + mn])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(super().forward(x))


def _shard_layer(layer: HybridLayer, shapes: TPShapes, comm: Collectives) -> HybridLayer:
    """A new :class:`HybridLayer` with this rank's mixer and MLP; the norms (replicated) are
    copied. ``layer`` is left as it was."""
    out = HybridLayer.__new__(HybridLayer)
    nn.Module.__init__(out)
    out.index, out.kind = layer.index, layer.kind
    out._mixer_range, out._mlp_range = layer._mixer_range, layer._mlp_range
    out.mixer_norm = copy.deepcopy(layer.mixer_norm)
    mixer_cls = TPAttention if layer.kind == "attn" else TPGDNMixer
    out.mixer = mixer_cls(layer.mixer, shapes, comm)
    out.mlp_norm = copy.deepcopy(layer.mlp_norm)
    out.mlp = TPMLP(layer.mlp, shapes, comm)
    return out


# ---- the model ----------------------------------------------------------------------------

class TPHybridModel(nn.Module):
    """Rank ``rank`` of ``world``'s slice of a :class:`~mamba_edu.model.HybridModel`, built by
    :func:`shard_model` (from a full model) or :func:`build_tp_model` (from a preset and a seed,
    one layer at a time). ``forward(batch, backend) -> ModelOutput`` as the full model's, with
    the collectives listed in the module docstring on ``group`` (the default process group when
    None). Attributes: ``config`` (this rank's, :func:`tp_config`), ``full_config``, ``shapes``
    (:class:`TPShapes`), ``rank``, ``world``."""

    def __init__(self, full_config: ModelConfig, shapes: TPShapes, embed: torch.Tensor,
                 layers: list[HybridLayer], norm: RMSNorm, lm_head: torch.Tensor, comm: Collectives):
        """``embed``, ``lm_head``: this rank's rows (``shapes.vocab``) of the full ones;
        ``layers``: this rank's (:func:`_shard_layer`)."""
        super().__init__()
        self.full_config, self.shapes, self.comm = full_config, shapes, comm
        self.config = tp_config(full_config, shapes.world)
        self.rank, self.world = shapes.rank, shapes.world
        self.vocab_start, self.vocab_rows = shapes.vocab
        self.embed = _param(embed)
        self.layers = nn.ModuleList(layers)
        self.norm = copy.deepcopy(norm)
        self.has_attention = bool(full_config.attn_layers)
        self.lm_head = _param(lm_head)

    device, dtype = HybridModel.device, HybridModel.dtype  # the embedding's, as the full model's

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: this rank's rows, zeros for the ids of other ranks, summed over
        the ranks (exact: every id has one nonzero row). Device ops only: no host sync."""
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_rows)
        x = self.embed[local.clamp(0, self.vocab_rows - 1)]
        return self.comm.all_reduce(torch.where(mine[:, None], x, torch.zeros((), dtype=x.dtype,
                                                                               device=x.device)))

    @torch.no_grad()
    def forward(self, batch, backend) -> ModelOutput:
        return run_forward(self, self._embed, batch, backend, gather_logits=self.comm.all_gather_cols)


def shard_model(full: HybridModel, rank: int, world: int, group=None) -> TPHybridModel:
    """Rank ``rank`` of ``world``'s slice of ``full`` (left unchanged), on ``full``'s device and in
    its dtype. ``world > 1`` needs ``torch.distributed`` initialised (``group``: the ranks'
    process group, the default one when None)."""
    if not isinstance(full, HybridModel):
        raise TypeError(f"full must be a HybridModel (mamba_edu.model.build_model); got {type(full).__name__}")
    shapes = TPShapes.of(full.config, rank, world)
    comm = Collectives(world, group)
    layers = [_shard_layer(layer, shapes, comm) for layer in full.layers]
    rows = slice(shapes.vocab[0], shapes.vocab[0] + shapes.vocab[1])
    return TPHybridModel(full.config, shapes, full.embed[rows], layers, full.norm, full.lm_head[rows],
                         comm).eval()


def build_tp_model(preset: str | ModelConfig = "tiny", rank: int = 0, world: int = 1, device=None,
                   dtype=torch.float32, seed: int = 0, group=None, **overrides) -> TPHybridModel:
    """Rank ``rank`` of ``world``'s slice of ``build_model(preset, device, dtype, seed,
    **overrides)``, drawn one layer at a time (the same random draws, in the same order, as
    :class:`~mamba_edu.model.HybridModel`), so a rank never holds more than one full layer beside
    the full embedding and LM head: the way to build a slice of a model too large for one device.
    ``tests/tp/test_tp.py`` checks that it equals :func:`shard_model` of the full model."""
    from mamba_edu._runtime import default_device

    cfg = get_config(preset, **overrides)
    shapes = TPShapes.of(cfg, rank, world)
    device = default_device() if device is None else torch.device(device)
    comm = Collectives(world, group)
    gen = torch.Generator(device=device).manual_seed(seed)
    out_std = (2 * cfg.n_layers) ** -0.5  # as HybridModel.__init__, draw for draw
    embed = init_param(gen, (cfg.vocab, cfg.hidden), 1.0, device, dtype)
    embed = embed[shapes.vocab[0]:shapes.vocab[0] + shapes.vocab[1]].clone()  # the full one goes
    layers = [_shard_layer(layer, shapes, comm) for layer in draw_layers(cfg, gen, device, dtype, out_std)]
    norm = RMSNorm(cfg.hidden, cfg.norm_eps, device, dtype)
    lm_head = init_param(gen, (cfg.vocab, cfg.hidden), cfg.hidden ** -0.5, device, dtype)
    lm_head = lm_head[shapes.vocab[0]:shapes.vocab[0] + shapes.vocab[1]]
    return TPHybridModel(cfg, shapes, embed, layers, norm, lm_head, comm).eval()
