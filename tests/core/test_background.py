"""One value computed in a forked background process (:func:`p2pdp.core.parallel.in_background`),
and the large run's centralised reference solved that way while its simulation runs."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import pytest

from p2pdp.core import parallel
from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.parallel import (
    Background,
    current_workers,
    forked_map,
    forked_worker,
    in_background,
    local_workers,
    shared_empty,
)
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import config_of, parse_scenario
from p2pdp.tasks import pipeline
from p2pdp.tasks.logistic import task as logistic_task

SCENARIO = """
name = "background"
seed = 3

[data]
dataset = "synthetic"
synthetic_rows = 3000
synthetic_test_rows = 400
synthetic_features = 6

[partition]
n_peers = 150

[groups]
group_size = 5

[evaluation]
split = "fixed"
"""


def _square_and_workers(x):
    return x * x, current_workers(), os.getpid()


def _fail(message):
    raise ConfigError(message)


def _die(code):
    os._exit(code)


def _read(background, _item):
    return background.result()


def test_the_value_comes_from_another_process_that_forks_nothing():
    background = in_background(_square_and_workers, np.arange(4.0), what="a square")
    assert isinstance(background, Background)
    square, workers, pid = background.result()
    np.testing.assert_array_equal(square, np.arange(4.0) ** 2)
    assert workers == 1 and pid != os.getpid()  # a worker: its own pieces run in it
    assert background.result()[2] == pid  # read once, kept


def test_its_error_is_raised_where_the_value_is_read():
    background = in_background(_fail, "lam = -1 is not > 0", what="a model")
    with pytest.raises(ConfigError, match="lam = -1 is not > 0"):
        background.result()


def test_a_process_that_dies_is_an_error_naming_what_it_computed():
    background = in_background(_die, 3, what="the centralised reference model")
    with pytest.raises(P2PDPError, match="computing the centralised reference model died .*3"):
        background.result()


def test_only_the_process_that_started_it_reads_it_and_pickling_waits():
    background = in_background(_square_and_workers, 3.0, what="a square")
    with pytest.raises(RuntimeError, match="read it there before forking"):
        forked_map(_read, background, [0, 1], workers=2)
    assert pickle.loads(pickle.dumps(background))[0] == 9.0


def test_an_unread_background_process_is_stopped_when_collected():
    background = in_background(time.sleep, 60, what="a nap")
    process = background._process
    del background
    process.join(timeout=10)
    assert not process.is_alive()


def _policy_once_waited_for(deadline):
    """This process's policy once it has left idle priority (or after ``deadline`` s)."""
    end = time.monotonic() + deadline
    while os.sched_getscheduler(0) == os.SCHED_IDLE and time.monotonic() < end:
        time.sleep(0.01)
    return os.sched_getscheduler(0)


@pytest.mark.skipif(
    not parallel._can_idle(), reason="this machine cannot undo idle priority (SCHED_IDLE)"
)
def test_it_runs_at_idle_priority_until_it_is_waited_for():
    """Before result() waits for it, the process is at idle priority (it runs only on a core
    nothing else wants); result() gives it normal priority back, so a machine busy with
    other work cannot starve a value the run is waiting for. So does stopping it, so that
    it exits at once."""
    background = in_background(_policy_once_waited_for, 20, what="a policy")
    pid = background._process.pid
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # set before in_background returned
    time.sleep(0.2)
    assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # nobody has waited yet
    assert background.result() == os.SCHED_OTHER  # result() gave normal priority back
    unread = in_background(time.sleep, 60, what="a nap")
    process = unread._process
    assert os.sched_getscheduler(process.pid) == os.SCHED_IDLE
    seen = []
    policy = parallel._set_policy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel, "_set_policy", lambda *a: seen.append(a[1]) or policy(*a))
        del unread
        process.join(timeout=10)
    assert not process.is_alive() and seen == [os.SCHED_OTHER]
    hurried = in_background(time.sleep, 0.3, what="a nap")
    assert os.sched_getscheduler(hurried._process.pid) == os.SCHED_IDLE
    hurried.hurry()  # read soon: normal priority now, without waiting for it
    assert os.sched_getscheduler(hurried._process.pid) == os.SCHED_OTHER
    assert hurried._process.is_alive() and hurried._done is None  # still running
    hurried.result()


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
def test_where_idle_priority_cannot_be_undone_it_runs_at_normal_priority(monkeypatch):
    monkeypatch.setattr(parallel, "_can_idle", lambda: False)
    background = in_background(time.sleep, 0.5, what="a nap")
    assert os.sched_getscheduler(background._process.pid) == os.SCHED_OTHER
    background.result()


def test_a_large_run_with_workers_solves_its_reference_in_the_background(monkeypatch):
    """Wiring: with 2 local workers and a large enough fold, prepare_peers returns before
    the centralised model is solved, the run reads it once scored, and every row (the
    centralised error included) equals the run whose reference was solved in-process."""
    config = config_of(parse_scenario(SCENARIO))
    alone = pipeline.prepare_peers(config, fold=0)
    assert isinstance(alone.reference, np.ndarray)  # one worker: solved in-process
    monkeypatch.setattr(pipeline, "BACKGROUND_MIN_ROWS", 1000)
    started = []

    def recorded(name):
        step = getattr(pipeline, name)

        def call(*args, **kwargs):
            started.append(name)
            return step(*args, **kwargs)

        monkeypatch.setattr(pipeline, name, call)

    recorded("in_background")
    recorded("peer_shards")
    hurry = Background.hurry
    monkeypatch.setattr(Background, "hurry", lambda self: started.append("hurry") or hurry(self))
    built = logistic_task.build_ensembles
    monkeypatch.setattr(
        logistic_task,
        "build_ensembles",
        lambda *a, **k: started.append("build_ensembles") or built(*a, **k),
    )
    with local_workers(2):
        trained = pipeline.prepare_peers(config, fold=0)
        assert isinstance(trained.reference, Background)  # did not wait for it
        assert started == ["in_background", "peer_shards"]  # before the partition and fits
        result = simulate(config, fold=0, trained=trained)
    # the evaluation shares the cores with it from its start (not alone at the end)
    assert started[2:4] == ["hurry", "build_ensembles"]
    np.testing.assert_allclose(trained.centralized, alone.centralized, rtol=0, atol=1e-12)
    expected = simulate(config, fold=0, trained=alone).row()
    row = result.row()
    assert row["centralized_error"] == expected["centralized_error"]
    timing = {key for key in row if key.startswith("wall_")}
    assert {k: v for k, v in row.items() if k not in timing} == {
        k: v for k, v in expected.items() if k not in timing
    }
    monkeypatch.setattr(pipeline, "BACKGROUND_MIN_ROWS", 10**9)
    with local_workers(2):
        assert isinstance(pipeline.prepare_peers(config, fold=0).reference, np.ndarray)


# -- a stream of pieces computed in one forked process (forked_worker) ---------------------
def _step(state: dict, item):
    """Changes the worker's copy of ``state`` (so the items must run in order, in one
    process) and writes into shared memory: a running sum, the pid, a failure on request."""
    if item == "fail":
        raise ConfigError("lam = -1 is not > 0")
    if item == "die":
        os._exit(5)
    state["total"] += item
    state["out"][item % 4] = state["total"]
    return state["total"], os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_forked_worker_computes_the_items_in_order_while_this_process_goes_on(workers):
    state = {"total": 0, "out": shared_empty((4,), np.int64)}
    with forked_worker(_step, state, workers=workers) as submit:
        results = [submit(item) for item in range(1, 4)]  # sent before any is read
        failed = submit("fail")
        last = submit(4)
        assert [result()[0] for result in results] == [1, 3, 6]
        with pytest.raises(ConfigError, match="lam = -1"):
            failed()
        total, pid = last()
    assert total == 10 and state["out"].tolist() == [10, 1, 3, 6]  # written by the worker
    assert (pid != os.getpid()) == (workers == 2)
    assert state["total"] == (10 if workers == 1 else 0)  # the worker's copy moved on


def test_a_forked_worker_that_dies_is_an_error_naming_its_function():
    with forked_worker(_step, {"total": 0}, workers=2) as submit:
        with pytest.raises(P2PDPError, match="computing _step died .*5"):
            submit("die")()


# -- every forked process runs with one BLAS thread ----------------------------------------
def _blas_threads(*_args):
    from threadpoolctl import threadpool_info

    return sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})


def _blas_threads_in_worker(_shared, _item):
    return _blas_threads()


def test_pool_workers_run_with_one_blas_thread_whatever_their_parent_has():
    """Workers are the parallelism: a forked worker's own BLAS threads only took CPU from
    the other workers (the synthetic rows drew in 2.5 s instead of 1.9 s at 10^5 peers).
    Its parent keeps its threads."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        assert _blas_threads() == [2]  # so that a worker inheriting them would show it
        assert forked_map(_blas_threads_in_worker, None, [0, 1], workers=2) == [[1], [1]]
        assert _blas_threads() == [2]


def test_a_blas_library_loaded_after_the_first_fork_also_runs_one_thread_in_workers():
    """The BLAS libraries are found once per set of imported modules: importing
    ``scipy.linalg`` (a second OpenBLAS) after a first forked map still gives the next
    workers one thread in every library. Run in a fresh interpreter, where nothing else
    loaded scipy first (in this process other tests may have)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        from threadpoolctl import threadpool_info, threadpool_limits
        from p2pdp.core.parallel import forked_map

        def threads(_shared, _item):
            pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
            return sorted((p["filepath"], p["num_threads"]) for p in pools)

        before = forked_map(threads, None, [0, 1], workers=2)
        import scipy.linalg  # a second BLAS library, loaded after the first forked map
        with threadpool_limits(limits=2, user_api="blas"):
            after = forked_map(threads, None, [0, 1], workers=2)
        assert len(after[0]) > len(before[0]), (before, after)
        assert {n for worker in after for _, n in worker} == {1}, after
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _faults_of_a_third_block(_shared, _item) -> int:
    """Minor page faults of a block's worth of temporaries (5-24 MB), freed and allocated
    again for the third time in this process."""
    import resource

    def block() -> None:
        rows = np.ones(3 * 2**20)
        column = np.ones(2 * 2**20)
        scaled = rows[:, None] * 2.0
        del rows, column, scaled

    block()
    block()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(
    not hasattr(__import__("ctypes").CDLL(None), "mallopt"), reason="glibc's malloc parameters"
)
def test_forked_workers_keep_freed_memory_for_their_next_block():
    """A worker's freed temporaries stay with its malloc for the next block instead of going
    back to the kernel and being faulted in and zeroed again (with glibc's defaults this
    block's 16,384 pages take about 1,500 faults every time: 0.55 s of kernel time per
    worker drawing the 10^5-peer rows)."""
    faults = forked_map(_faults_of_a_third_block, None, [0, 1], workers=2)
    assert max(faults) < 64, faults


def test_prefault_brings_in_the_pages_of_its_view_and_no_others():
    """Rows of fresh shared memory prefaulted (one madvise) are written with no page fault
    (the synthetic rows' blocks); rows outside the view are still faulted in when written."""
    import resource

    from p2pdp.core.parallel import prefault

    def faults_writing(view) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        view.fill(1)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    import mmap

    try:
        mmap.mmap(-1, mmap.PAGESIZE).madvise(parallel._MADV_POPULATE_WRITE)
    except (OSError, AttributeError):
        pytest.skip("the kernel has no MADV_POPULATE_WRITE (Linux 5.14+): prefault does nothing")
    rows = shared_empty((100_000, 58))[:, :57]  # the synthetic rows' strided layout
    prefault(rows[10_000:60_000])
    assert faults_writing(rows[10_000:60_000]) < 60  # 5,664 pages otherwise
    assert faults_writing(rows[70_000:90_000]) > 1_000  # not prefaulted
    prefault(rows[95_000:])  # up to the mapping's last page (its spare column unused)
    assert faults_writing(rows[95_000:]) < 60  # 566 pages otherwise
    prefault(np.ones(3))  # not shared memory: nothing to do
    # the pages advised: from the view's first element's to its last's, within the mapping
    advised = []
    advise = parallel._SharedMemory.madvise
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            parallel._SharedMemory, "madvise", lambda m, *a: advised.append(a[1:]) or advise(m, *a)
        )
        page = mmap.PAGESIZE
        one = shared_empty((3 * page,), np.uint8)
        prefault(one[2 * page + 5 : 2 * page + 6])  # one element: its page
        prefault(one[page - 1 : page + 1])  # two elements astride a page boundary
        prefault(rows[99_999:])  # the last row, its spare column excluded: the last page
        prefault(rows[:, 3][10:20])  # one column of ten rows (strided)

    size = 100_000 * 58 * 8  # the rows' mapping, not a whole number of pages

    def pages(first: int, end: int) -> tuple[int, int]:  # the pages of bytes [first, end)
        start = first // page * page
        return start, min(size, -(-end // page) * page) - start

    assert advised == [
        (2 * page, page),
        (0, 2 * page),
        pages(size - 58 * 8, size),
        pages((10 * 58 + 3) * 8, (19 * 58 + 3) * 8 + 8),
    ]
