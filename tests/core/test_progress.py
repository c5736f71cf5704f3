"""What running cells say they are doing (p2pdp.core.progress), read by another thread."""

from __future__ import annotations

import queue
import threading

from p2pdp.core.progress import report_every, running, running_cell, set_phase


def test_a_cell_says_its_phase_and_its_counter_is_read_when_reported():
    done = [0]
    reads = []

    def counter():
        reads.append(done[0])
        return f"round {done[0]} of 3"

    set_phase("outside any cell")  # nothing to attach it to: ignored
    assert running() == {}
    with running_cell("p0-f0-r0"):
        assert running() == {"p0-f0-r0": ""}
        set_phase("simulation", counter)
        for round_ in range(1, 4):
            done[0] = round_  # what the loop writes; nobody reads it meanwhile
        assert reads == []
        assert running() == {"p0-f0-r0": "simulation, round 3 of 3"}
        set_phase("evaluation")
        assert running() == {"p0-f0-r0": "evaluation"}
    assert running() == {}
    assert reads == [3]


def test_cells_of_several_threads_are_all_listed():
    started, finish = threading.Barrier(3), threading.Event()

    def cell(name):
        with running_cell(name):
            set_phase(f"phase of {name}")
            started.wait()
            finish.wait()

    threads = [threading.Thread(target=cell, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    started.wait()
    assert running() == {"a": "phase of a", "b": "phase of b"}
    finish.set()
    for thread in threads:
        thread.join()
    assert running() == {}


def test_a_reporter_sends_what_changed():
    sent: queue.Queue = queue.Queue()
    stop = report_every(0.01, sent.put)
    try:
        with running_cell("c"):
            set_phase("training")
            assert sent.get(timeout=10) == {"c": "training"}
            set_phase("simulation")
            assert sent.get(timeout=10) == {"c": "simulation"}
        assert sent.get(timeout=10) == {}
    finally:
        stop.set()
