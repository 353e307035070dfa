"""The hybrid model: preset shapes (docs/conventions.md), layer layout, seeding, scale, profiler ranges."""

from dataclasses import fields

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from mamba_edu.engine import Engine, Request
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.model import PRESETS, GDNMixer, ModelConfig, ModelOutput, build_model, get_config
from mamba_edu.serving import ForwardBatch, GDNLayerParams, LinearAttentionBackend


def test_presets_match_the_design():
    nxt, q35, tp8 = PRESETS["qwen3-next"], PRESETS["qwen3.5"], PRESETS["qwen3.5-tp8"]
    assert (nxt.hidden, nxt.n_layers, len(nxt.gdn_layers), len(nxt.attn_layers)) == (2048, 48, 36, 12)
    assert (nxt.gdn_key_heads, nxt.gdn_value_heads, nxt.gdn_key_dim, nxt.gdn_value_dim) == (16, 32, 128, 128)
    assert (nxt.attn_heads, nxt.attn_kv_heads, nxt.attn_head_dim, nxt.conv_width) == (16, 2, 256, 4)
    assert nxt.conv_dim == 8192 and nxt.attn_layers[:2] == [3, 7]
    assert (q35.hidden, q35.n_layers, len(q35.gdn_layers), len(q35.attn_layers)) == (4096, 60, 45, 15)
    assert (q35.gdn_key_heads, q35.gdn_value_heads, q35.attn_heads, q35.attn_kv_heads) == (16, 64, 32, 2)
    assert (tp8.gdn_key_heads, tp8.gdn_value_heads, tp8.attn_heads, tp8.attn_kv_heads) == (2, 8, 4, 1)
    assert tp8.mlp_width == q35.mlp_width // 8 and tp8.n_layers == 60 and tp8.hidden == 4096
    tiny = PRESETS["tiny"]
    assert (len(tiny.gdn_layers), len(tiny.attn_layers)) == (3, 1)


def test_attention_every_k_and_none():
    assert get_config("tiny", n_layers=6, attn_every=3).attn_layers == [2, 5]
    assert get_config("tiny", attn_every=0).attn_layers == []


@pytest.mark.parametrize("field, value, needle", [
    ("attn_every", -1, "attn_every"), ("gdn_value_heads", 3, "gdn_value_heads"),
    ("attn_kv_heads", 3, "attn_heads"), ("hidden", 0, "hidden"), ("conv_width", 1, "conv_width"),
])
def test_bad_config_names_the_field(field, value, needle):
    with pytest.raises(ValueError, match=needle):
        get_config("tiny", **{field: value})


def test_unknown_preset():
    with pytest.raises(ValueError, match="preset"):
        build_model("qwen4", device="cpu")


def test_seeded_weights():
    a, b = build_model("tiny", device="cpu", seed=1), build_model("tiny", device="cpu", seed=1)
    c = build_model("tiny", device="cpu", seed=2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["embed"], sc["embed"])


def test_activations_stay_order_one_over_60_layers():
    """The residual stream after every layer of the real forward (read with forward hooks, not a
    re-implementation of the loop) stays O(1) over 60 layers."""
    cfg = ModelConfig(vocab=64, hidden=32, n_layers=60, attn_every=4, gdn_key_heads=1, gdn_value_heads=2,
                      gdn_key_dim=8, gdn_value_dim=8, conv_width=4, attn_heads=2, attn_kv_heads=1,
                      attn_head_dim=8, mlp_width=64)
    model = build_model(cfg, device="cpu")
    rms = {}

    def record(layer, _inputs, output):
        h, mlp_out, _kv = output  # the stream is h + mlp_out: the next layer's norm adds them
        rms[layer.index] = (h + mlp_out).pow(2).mean().sqrt().item()

    hooks = [layer.register_forward_hook(record) for layer in model.layers]
    try:
        Engine(model, strategy="sync_free", max_requests=1).prefill([Request(0, list(range(16)))])
    finally:
        for h in hooks:
            h.remove()
    assert sorted(rms) == list(range(60))
    for index, value in rms.items():
        assert 0.3 < value < 3.0, f"layer {index}: rms {value}"


def test_equal_fresh_prompts_attend_in_one_call_like_one_by_one():
    model = build_model("tiny", device="cpu")
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 128, (100,), generator=gen).tolist() for _ in range(3)]
    batched = Engine(model, strategy="sync_free", max_requests=3).prefill(
        [Request(i, p) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        alone = Engine(model, strategy="sync_free", max_requests=1).prefill([Request(i, p)])
        torch.testing.assert_close(batched.logits[i], alone.logits[0], rtol=1e-5, atol=1e-5)


def test_gdn_layers_satisfy_the_backend_protocol_with_its_shapes():
    model = build_model("tiny", device="cpu")
    cfg = model.config
    H, HV, K, V, W, D = (cfg.gdn_key_heads, cfg.gdn_value_heads, cfg.gdn_key_dim, cfg.gdn_value_dim,
                         cfg.conv_width, cfg.conv_dim)
    mixers = [layer.mixer for layer in model.layers if isinstance(layer.mixer, GDNMixer)]
    assert [m.gdn_index for m in mixers] == list(range(len(cfg.gdn_layers)))
    for m in mixers:
        assert isinstance(m, GDNLayerParams)
        assert m.conv_weight.shape == (D, W) and m.conv_bias.shape == (D,)
        assert m.A_log.shape == m.dt_bias.shape == (HV,) and m.A_log.dtype == torch.float32
        assert m.norm_weight.shape == (V,) and isinstance(m.norm_eps, float)
        q, k, v = m.split_qkv(torch.randn(5, D))
        assert (q.shape, k.shape, v.shape) == ((5, H, K), (5, H, K), (5, HV, V))
    assert not isinstance(model.layers[cfg.attn_layers[0]].mixer, GDNLayerParams)


def test_a_gdn_layer_that_does_not_fit_the_pool_is_refused_when_the_backend_is_built():
    """The backend checks its model's layers once, when it is built; the forward trusts them."""
    model = build_model("tiny", device="cpu")
    mixer = next(layer.mixer for layer in model.layers if layer.kind == "gdn")
    mixer.conv_weight = torch.nn.Parameter(mixer.conv_weight[:, 1:], requires_grad=False)
    cfg = model.config
    with pytest.raises(ValueError, match=rf"conv_weight must be \[D, W\]=\[{cfg.conv_dim}, {cfg.conv_width}\]"):
        Engine(model)


def test_output_norm_in_the_backend_is_the_norm_after_it(monkeypatch):
    """The GDN layers hand z to the backend, which returns the normed output (on a GPU the prefill
    computes it in its output kernel). On the CPU the logits of a prefill and of decode steps are
    bit for bit those of the unnormed backend output followed by ``gated_rms_norm``."""
    model = build_model("tiny", device="cpu")
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (70, 9)]

    def run():
        engine = Engine(model, strategy="sync_free", max_requests=2)
        prefill = engine.prefill([Request(i, p) for i, p in enumerate(prompts)])
        return prefill.logits, engine.decode(2).logits

    in_backend = run()
    unnormed = LinearAttentionBackend.forward

    def norm_after(self, layer, mixed_qkv, a, b, batch, z=None):
        o = unnormed(self, layer, mixed_qkv, a, b, batch)
        return gated_rms_norm(o, z, layer.norm_weight, layer.norm_eps)
    monkeypatch.setattr(LinearAttentionBackend, "forward", norm_after)
    for fused, separate in zip(in_backend, run()):
        assert torch.equal(fused, separate)


def test_the_forward_returns_each_sequence_kv_and_the_batch_holds_inputs_only():
    model = build_model("tiny", device="cpu")
    cfg, prompt = model.config, list(range(100))
    engine = Engine(model, strategy="sync_free", max_requests=2)
    engine.prefill([Request("seed", prompt[:70])])  # caches a snapshot at 64 tokens
    engine.release(["seed"])
    batch = engine.prepare_prefill([Request("hit", prompt[:90]), Request("fresh", prompt[:20])])
    engine.backend.init_forward_metadata(batch)
    out = model(batch, engine.backend)
    assert isinstance(out, ModelOutput) and out.logits.shape == (2, cfg.vocab)
    assert batch.prefix_lens == [64, 0]
    assert [len(seq_kv) for seq_kv in out.kv] == [len(cfg.attn_layers)] * 2
    for seq_kv, n in zip(out.kv, (90, 20)):  # prefix and new tokens
        for k, v in seq_kv:
            assert k.shape == v.shape == (n, cfg.attn_kv_heads, cfg.attn_head_dim)
    torch.testing.assert_close(out.kv[0][0][0][:20], out.kv[1][0][0])  # same tokens, same keys
    assert "kv_out" not in {f.name for f in fields(ForwardBatch)}


def test_profiler_ranges_name_layers_and_tracking():
    model = build_model("tiny", device="cpu")
    engine = Engine(model, strategy="precomputed", max_requests=1)
    batch = engine.prepare_prefill([Request(0, list(range(70)))])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.forward_prefill(batch)
    names = {e.name for e in prof.events()}
    assert {"layer00.gdn", "layer03.attn", "layer02.mlp", "track.conv", "track.ssm",
            "init_forward_metadata", "lm_head"} <= names
