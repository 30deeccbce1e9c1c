"""CUDA streams for a GPU plan's branches (runtime/streams.py): the schedule orders every pair of
steps that must stay ordered, with no redundant waits; and a GPU plan run on streams, in random
orders that keep only the streams' and events' guarantees (stream_simulator.py), equals the serial
plan bit for bit. The plan runs on the numpy stand-in for CuPy of gpu_stand_in.py; the same
plan on a real device is the gpu-marked test at the end."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tests.runtime.gpu_stand_in import CXX, RAW_MODULE, ROOT, STAND_IN, run_stand_in
from toolkit.backend.devices import gpu_available
from toolkit.runtime.streams import assign_streams

INCEPTION = ROOT / "benchmarks" / "nets" / "inception.yaml"


def happens_before(schedule) -> list[set[int]]:
    """For each step, every step ordered before it by stream order and event waits."""
    before: list[set[int]] = []
    last_on: dict[int, int] = {}
    for s, stream in enumerate(schedule.stream_of):
        seen: set[int] = set()
        for t in ([last_on[stream]] if stream in last_on else []) + schedule.waits[s]:
            seen |= before[t] | {t}
        before.append(seen)
        last_on[stream] = s
    return before


def test_towers_from_one_input_take_one_stream_each_and_the_join_waits_for_them():
    # step 0 makes the input; 1-4, 5-8: four towers of two steps each; 9 joins them
    must = [[], [0], [0], [0], [0], [1], [2], [3], [4], [5, 6, 7, 8]]
    schedule = assign_streams(must)
    assert schedule.streams == 4
    towers = [schedule.stream_of[k] for k in (5, 6, 7, 8)]
    assert sorted(towers) == [0, 1, 2, 3]
    assert [schedule.stream_of[k] for k in (1, 2, 3, 4)] == towers
    assert schedule.stream_of[9] == schedule.stream_of[8] and schedule.waits[9] == [5, 6, 7]
    assert schedule.waits[2] == schedule.waits[3] == schedule.waits[4] == [0]


def test_a_chain_stays_on_one_stream_without_events():
    schedule = assign_streams([[]] + [[k] for k in range(9)])
    assert schedule.streams == 1 and not schedule.recorded


def test_a_wait_implied_by_an_earlier_one_is_dropped():
    # 2 follows 0 (stream 0) and 1 (stream 1); 3 on stream 1 follows 2... 4 follows 1 and 2
    must = [[], [], [0, 1], [2], [1, 2, 3]]
    schedule = assign_streams(must)
    before = happens_before(schedule)
    for s, ts in enumerate(must):
        assert set(ts) <= before[s]
    assert sum(len(w) for w in schedule.waits) == 1      # only 2 waits (for 0 or 1, whichever is apart)


@pytest.mark.parametrize("max_streams", [2, 4])
def test_random_graphs_every_ordering_kept(max_streams):
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n = int(rng.integers(5, 60))
        must = [sorted(set(rng.choice(s, size=min(s, int(rng.integers(0, 4))), replace=False).tolist()))
                for s in range(n)]
        schedule = assign_streams(must, max_streams)
        assert schedule.streams <= max_streams
        before = happens_before(schedule)
        for s, ts in enumerate(must):
            assert set(ts) <= before[s], (seed, s, ts)
            for t in schedule.waits[s]:             # no wait that stream order or other waits imply
                assert schedule.stream_of[t] != schedule.stream_of[s], (seed, s, t)
                others = [u for u in schedule.waits[s] if u != t]
                prior = happens_before_without(schedule, s, t, before)
                assert t not in prior, (seed, s, t, others)


def happens_before_without(schedule, s, dropped, before) -> set[int]:
    """What is ordered before step s when its wait on ``dropped`` is removed."""
    seen: set[int] = set()
    stream = schedule.stream_of[s]
    earlier = [u for u in range(s) if schedule.stream_of[u] == stream]
    for t in earlier[-1:] + [u for u in schedule.waits[s] if u != dropped]:
        seen |= before[t] | {t}
    return seen


SCRIPT = STAND_IN + RAW_MODULE + textwrap.dedent("""
    import functools, warnings
    import numpy as np
    warnings.simplefilter("ignore", RuntimeWarning)     # the broken schedule reads garbage
    import toolkit.benchmarking as bench
    from toolkit.frontend import Net
    from toolkit.runtime import streams
    from toolkit.runtime.plan import Plan
    from tests.runtime.stream_simulator import SimulatedStreams
    net = Net.load(sys.argv[1])

    def runs(train, concurrent, seed=0, broken=False):
        backends = []
        def backend(device):
            backends.append(SimulatedStreams(seed))
            return backends[-1]
        streams.backend_factory = backend
        if broken:                             # a schedule without its waits: must give wrong values
            real = streams.assign_streams
            def no_waits(must, *a):
                schedule = real(must, *a)
                schedule.waits = [[] for _ in schedule.waits]
                return schedule
            streams.assign_streams = no_waits
            from toolkit.runtime import scheduling
            scheduling.assign_streams = no_waits
        bench.Plan = functools.partial(Plan, concurrent=concurrent, native=False)
        plan, inputs = bench.bench_plan(net, 3, train, device="gpu")
        out = [{k: np.array(v) for k, v in plan.run(inputs).items()} for _ in range(3 if train else 1)]
        if broken:
            streams.assign_streams = scheduling.assign_streams = real
        return plan, out, backends

    for train in (False, True):
        serial, want, _ = runs(train, False)
        assert serial.schedule.stream_schedule is None
        for seed in range(3):
            plan, got, backends = runs(train, True, seed)
            assert plan.execution.on_streams and plan.schedule.stream_schedule.streams >= 2, plan.schedule
            # each run's steps, and once more the capture's (graph_simulator.py runs it, then undoes it)
            runs_of_steps = len(got) + plan.captured
            assert backends and backends[0].ran == len(plan.steps) * runs_of_steps, (backends[0].ran, len(plan.steps))
            for a, b in zip(want, got):
                for k in a:
                    np.testing.assert_array_equal(b[k], a[k], err_msg=f"train={train} seed={seed} {k}")
        waits = sum(len(w) for w in plan.schedule.stream_schedule.waits)
        print(f"train={train}: {len(plan.steps)} steps on {plan.schedule.stream_schedule.streams} streams, "
              f"{waits} waits")
        wrong = 0
        for seed in range(3):
            _plan, got, _ = runs(train, True, seed, broken=True)
            wrong += any(not np.array_equal(b[k], a[k]) for a, b in zip(want, got) for k in a)
        assert wrong >= 1, "dropping every wait changed nothing: the simulation cannot catch a missing one"
    print("ok")
""")


@pytest.mark.skipif(CXX is None, reason="emulating CUDA kernels needs a C++ compiler (g++ or c++)")
def test_gpu_plan_on_streams_equals_the_serial_plan_in_any_order_streams_allow(tmp_path):
    result = run_stand_in(SCRIPT, tmp_path, INCEPTION)
    print(result.stdout)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("train", [False, True])
def test_streams_on_a_device_equal_the_serial_plan(monkeypatch, train):
    import functools

    import toolkit.benchmarking as bench
    from toolkit.frontend import Net
    from toolkit.runtime.plan import Plan
    results = {}
    for concurrent in (False, True):
        monkeypatch.setattr(bench, "Plan", functools.partial(Plan, concurrent=concurrent))
        plan, inputs = bench.bench_plan(Net.load(str(INCEPTION)), 16, train, device="gpu")
        results[concurrent] = [{k: np.array(v.get()) for k, v in plan.run(inputs).items()}
                               for _ in range(3 if train else 1)]
        assert plan.execution.on_streams == concurrent
    for a, b in zip(results[False], results[True]):
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-6, err_msg=k)
