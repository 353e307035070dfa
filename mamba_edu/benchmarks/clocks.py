"""The GPU's SM clock and power during a benchmark run, matched to its measurements.

``scripts/gpu_bench.sh`` samples ``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,
power.draw,temperature.gpu --format=csv -lms 200`` into ``gpu_clocks.csv`` while the bench runs,
and every result row records when its timing began (``started_utc``). A row's samples are those
from its start to the next row's start. A CUDA-graph replay keeps the GPU busy without pause; if
it then reaches the power limit, the SM clock drops and every kernel takes longer.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path


@dataclass(frozen=True)
class ClockSample:
    time: datetime
    sm_mhz: float
    power_w: float


@dataclass(frozen=True)
class RowClocks:
    """The samples taken while one result row was measured."""

    label: str
    samples: int
    sm_mean_mhz: float
    sm_min_mhz: float
    power_max_w: float


def read_clock_log(path: Path) -> list[ClockSample]:
    """The samples of an ``nvidia-smi`` CSV log (header line first; unreadable lines skipped)."""
    samples = []
    with open(path, newline="") as f:
        for row in list(csv.reader(f))[1:]:
            try:
                time = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
                samples.append(ClockSample(time, float(row[1].split()[0]), float(row[3].split()[0])))
            except (ValueError, IndexError):
                continue
    return samples


def clocks_per_row(rows, samples: list[ClockSample], case: str) -> list[RowClocks]:
    """Clock statistics for each row of ``case`` (bench :class:`Result` rows with ``started_utc``)."""
    timed = sorted(((datetime.strptime(r.started_utc, "%Y-%m-%dT%H:%M:%S"), r)
                    for r in rows if r.started_utc), key=lambda pair: pair[0])
    out = []
    for i, (start, row) in enumerate(timed):
        stop = timed[i + 1][0] if i + 1 < len(timed) else start + timedelta(seconds=5)
        window = [s for s in samples if start <= s.time < stop]
        if row.case == case and window:
            out.append(RowClocks(row.label, len(window),
                                 sum(s.sm_mhz for s in window) / len(window),
                                 min(s.sm_mhz for s in window),
                                 max(s.power_w for s in window)))
    return out
