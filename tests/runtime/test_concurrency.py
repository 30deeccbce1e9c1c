"""Concurrent branches on the CPU (runtime/concurrency.py): which steps may share a wave, and
plans run wave by wave equal the serial plan bit for bit (same single-threaded kernels)."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import toolkit.benchmarking as bench
from toolkit import settings
from toolkit.frontend import Net
from toolkit.runtime import concurrency
from toolkit.runtime.concurrency import waves
from toolkit.runtime.plan import Plan

INCEPTION = Path(__file__).resolve().parents[2] / "benchmarks" / "nets" / "inception.yaml"


def test_waves_follow_reads_and_writes_of_overlapping_bytes():
    a, b, c = (0, 0, 100), (0, 100, 200), (1, 0, 50)
    reads = [[], [], [a], [b], [], []]
    writes = [[a], [b], [c], [(1, 40, 60)], [(0, 150, 160)], [(2, 0, 8)]]
    # 0, 1 write apart; 2 reads 0's bytes; 3 reads 1's and writes over 2's (bytes 40-50);
    # 4 writes where 3 reads; 5 touches nothing of theirs
    assert waves(reads, writes, [False] * 6) == [[0, 1, 5], [2], [3], [4]]


def test_steps_drawing_random_numbers_keep_their_order():
    regions = [[(k, 0, 8)] for k in range(4)]
    assert waves([[]] * 4, regions, [True, False, True, True]) == [[0, 1], [2], [3]]


@pytest.mark.parametrize("value, expected", [("1", True), ("on", True), ("0", False), ("", False)])
def test_environment_switch(value, expected):
    with settings.use(concurrent=settings.from_environment({"TOOLKIT_CONCURRENT": value}).concurrent):
        assert concurrency.concurrent_default() is expected


def _plan(monkeypatch, batch, train, **options):
    monkeypatch.setattr(bench, "Plan", functools.partial(Plan, **options))
    return bench.bench_plan(Net.load(str(INCEPTION)), batch, train)


@pytest.mark.parametrize("train", [False, True])
def test_inception_block_runs_its_towers_side_by_side_with_the_serial_results(monkeypatch, train):
    serial, inputs = _plan(monkeypatch, 3, train, concurrent=False, threads=1)
    waved, _ = _plan(monkeypatch, 3, train, concurrent=True, threads=2)
    assert waved.execution.concurrent and not serial.execution.concurrent
    first = {waved.steps[s].scope.split("+")[0] for s in waved.schedule.waves[0]}
    # GEMM batching may merge the 1x1 convolutions that read the input; the pool tower's first
    # step never merges with them, so the first wave always holds at least two towers
    assert "t4_pool" in first and len(waved.schedule.waves[0]) >= 2, first
    for step in range(3 if train else 1):
        want = {k: np.array(v) for k, v in serial.run(inputs).items()}
        got = {k: np.array(v) for k, v in waved.run(inputs).items()}
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"step {step} {k}")
