"""`phases.PhaseTimer`: phases that do not overlap add up to the wall time; the log line.
(A whole run's phases are checked in test_train_binary.py and test_api.py.)"""

from __future__ import annotations

import pytest

from tff_clustered.loop.phases import PhaseTimer, phases_line


def test_phases_do_not_nest_and_moving_time_keeps_the_sum() -> None:
    timer = PhaseTimer()
    with timer.phase("loading"):
        with pytest.raises(RuntimeError, match="inside phase 'loading'"):
            with timer.phase("building"):
                pass
        timer.add("tracing", 0.5)  # parts are measured inside phases
    with pytest.raises(ValueError, match="unknown phase"):
        with timer.phase("tracing"):
            pass
    steps = list(timer.timed("rounds", iter(["a", "b"])))
    assert [item for item, _ in steps] == ["a", "b"]
    timer.move("rounds", "evaluation", steps[0][1].seconds)
    report = timer.report()
    assert list(report) == ["loading", "rounds", "evaluation", "unaccounted", "wall", "parts"]
    assert report["parts"] == {"tracing": 0.5}
    timed = report["loading"] + report["rounds"] + report["evaluation"]
    assert timed + report["unaccounted"] == pytest.approx(report["wall"], abs=1e-12)
    assert report["evaluation"] == steps[0][1].seconds and report["rounds"] >= 0


def test_the_log_line_puts_each_part_after_its_phase() -> None:
    report = {
        "loading": 3.14,
        "cold_start": 45.2,
        "rounds": 20.3,
        "unaccounted": 0.06,
        "wall": 68.7,
        "parts": {"training": 15.0, "server": 3.1, "tracing": 1.25},
    }
    assert phases_line(report) == (
        "time: loading 3.1 s, cold start 45.2 s, rounds 20.3 s (training 15.0, server 3.1), "
        "unaccounted 0.1 s; wall 68.7 s, of which tracing 1.2 s (building rounds, in the "
        "phases above)"
    )
