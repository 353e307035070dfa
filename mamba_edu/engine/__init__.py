"""The engine (:class:`Engine`), what it takes and returns, its prepared batches and its captured
buckets. ``docs/architecture.md`` ("Fail-stop") states its contract: checked at the boundary,
fail-stop, one call at a time."""

from mamba_edu.engine.batches import LiveBatches, PreparedPrefill
from mamba_edu.engine.bucket import Bucket, StaticBucket
from mamba_edu.engine.engine import MAX_DECODE_STEPS, Engine
from mamba_edu.engine.fail_stop import EngineStopped
from mamba_edu.engine.graph import CAPTURE_MODES, CapturedBucket
from mamba_edu.engine.requests import (DecodeResult, EngineStats, PrefillResult, Request, RunningRequest,
                                       check_rid)

__all__ = ["CAPTURE_MODES", "MAX_DECODE_STEPS", "Bucket", "CapturedBucket", "DecodeResult", "Engine",
           "EngineStats", "EngineStopped", "LiveBatches", "PrefillResult", "PreparedPrefill", "Request",
           "RunningRequest", "StaticBucket", "check_rid"]
