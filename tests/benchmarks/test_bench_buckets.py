"""``bench-buckets``' cases as plain data (its --help imports no torch): the names it keeps agree
with the engine's and the serving layer's, and each case's bucket is the engine's. The runs
themselves need a GPU (scripts/gpu_buckets.sh). ``--prefill-kernels``: the arms each kernel
adds, and the kernels this machine cannot run refused in one line before any work."""

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

from mamba_edu import data_dir
from mamba_edu.benchmarks import buckets
from mamba_edu.engine import CAPTURE_MODES, Bucket
from mamba_edu.serving import STRATEGIES, fla_prefill

FLA_RUNS = torch.cuda.is_available() and importlib.util.find_spec("fla") is not None


def test_the_plain_names_are_the_packages_names():
    assert buckets.CAPTURE_MODES == tuple(CAPTURE_MODES)
    assert buckets.STRATEGIES == tuple(STRATEGIES)


def test_each_case_has_the_engines_bucket_and_draws_batches_that_fit():
    gen = torch.Generator().manual_seed(0)
    for case in buckets.CASES + buckets.SWEEP:
        assert case.bucket == Bucket(case.max_tokens, case.max_requests)
        for _ in range(5):
            lengths = buckets.draw_lengths(case, gen)
            assert 1 <= len(lengths) <= case.max_requests and sum(lengths) <= case.max_tokens
            assert min(lengths) >= 1
        for strategy, mode, kernel in buckets.arms(case, ("triton", "fla")):
            assert strategy in STRATEGIES and mode in ("eager", *CAPTURE_MODES)
            assert kernel in fla_prefill.PREFILL_KERNELS


def test_ours_alone_by_default_and_fla_adds_what_it_can_run():
    case = buckets.CASES[0]  # launch_bound_512x1: every strategy eager and breakable
    ours = buckets.arms(case)
    assert ours == buckets.arms(case, ("triton",)) and {k for *_, k in ours} == {"triton"}
    assert [(s, m) for s, m, _ in ours] == buckets.triton_arms(case)
    both = buckets.arms(case, ("triton", "fla"))
    assert both[:len(ours)] == ours  # ours first, as before: the rounds alternate all of them
    assert both[len(ours):] == [(s, m, "fla") for m in ("eager", "breakable")
                                for s in ("naive", "precomputed", "sync_free")]
    assert buckets.arms(buckets.SWEEP[0], ("triton", "fla")) == buckets.arms(buckets.SWEEP[0])  # fused only


def test_fla_arms_are_those_the_engine_lets_it_run(monkeypatch):
    """FLA_STRATEGIES and FLA_MODES are plain data: the serving layer's and the engine's checks
    refuse exactly the others (fla's import faked: what is checked here is the refusals)."""
    from mamba_edu.engine.graph import check_capture

    monkeypatch.setattr(fla_prefill, "fla_steps", lambda: None)
    for strategy in STRATEGIES:
        if strategy in buckets.FLA_STRATEGIES:
            assert fla_prefill.check_prefill_kernel("fla", strategy, "cuda") == "fla"
        else:
            with pytest.raises(ValueError, match="fused"):
                fla_prefill.check_prefill_kernel("fla", strategy, "cuda")
    sync_free = argparse.Namespace(name="sync_free", capturable=True)
    for mode in set(CAPTURE_MODES) - set(buckets.FLA_MODES):
        with pytest.raises(ValueError, match="prefill_kernel='fla'"):
            check_capture(Bucket(64, 1), mode, False, sync_free, None, "fla")


def test_kernels_are_checked_after_parsing_ours_always_run(monkeypatch):
    parser = argparse.ArgumentParser()
    assert buckets.checked_kernels(parser, "triton") == ("triton",)
    checked = []
    monkeypatch.setattr(fla_prefill, "check_prefill_kernel", lambda k, s, d: checked.append(k) or k)
    assert buckets.checked_kernels(parser, "fla,fla") == ("triton", "fla")
    assert checked == ["triton", "fla"]


@pytest.mark.parametrize("kernels, words", [("triton,nope", "must be one of"),
                                            ("fla", "prefill_kernel='fla' needs")])
def test_a_kernel_this_machine_cannot_run_is_refused_in_one_line(capsys, kernels, words):
    if kernels == "fla" and FLA_RUNS:
        pytest.skip("fla runs here")
    with pytest.raises(SystemExit) as exit_:
        buckets.main(["--prefill-kernels", kernels, "--out", "/nonexistent/never-written"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[0].startswith("usage: ")
    assert err[-1].startswith("python -m mamba_edu bench-buckets: error: --prefill-kernels: ")
    assert words in err[-1] and all(line.startswith(" ") for line in err[1:-1])  # usage, one line


def test_make_results_labels_fla_rows_and_keeps_ours_in_the_headline(monkeypatch):
    """Rows without ``prefill_kernel`` are ours; an fla row shows in the run's table, labelled,
    and leaves the README's headline (ours) as it was."""
    results = Path(__file__).parents[2] / "scripts" / "make_results.py"
    if not (data_dir() / "bench" / "buckets" / "results.json").exists():
        pytest.skip("data/ is not in this checkout")
    spec = importlib.util.spec_from_file_location("make_results", results)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    headline, table, plain = gen.readme_block(), gen.bucket_run(gen.BUCKETS), gen.load

    def with_fla_rows(rel):
        d = plain(rel)
        if "buckets" in rel:
            d["rows"] += [{**r, "prefill_kernel": "fla", "ttft_ms": 1e3} for r in d["rows"]
                          if r["strategy"] == "sync_free" and r["mode"] in ("eager", "breakable")]
        return d
    monkeypatch.setattr(gen, "load", with_fla_rows)
    assert "| fla" not in table and "| fla sync_free eager |" in gen.bucket_run(gen.BUCKETS)
    assert gen.readme_block() == headline
