"""``bench-buckets``' cases as plain data (its --help imports no torch): the names it keeps agree
with the engine's and the serving layer's, and each case's bucket is the engine's. The runs
themselves need a GPU (scripts/gpu_buckets.sh)."""

import torch

from mamba_edu.benchmarks import buckets
from mamba_edu.engine import CAPTURE_MODES, Bucket
from mamba_edu.serving import STRATEGIES


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
        for strategy, mode in buckets.arms(case):
            assert strategy in STRATEGIES and mode in ("eager", *CAPTURE_MODES)
