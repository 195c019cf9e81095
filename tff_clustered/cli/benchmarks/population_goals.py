"""The population benchmark's goals, judged from its runs' figures.

The population benchmark's goals (issue "Populations of 100,000 to 1,000,000 clients"),
judged from its runs' figures: pure, without the benchmark's flags, so that tests can import
it next to the training flags."""

from __future__ import annotations

from typing import Any, Optional


def goal_checks(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goals per algorithm and execution, for the sizes that were run: seconds per
    round at 10^6 within 1.2x of 10^3, start-up at 10^5 under 10 s and at 10^6 under 60 s, peak
    memory at 10^6 within 1.5x of 10^4, and an evaluation of 1,000 clients at most one round."""
    by_case = {(r["clients"], r["algorithm"], r["execution"]): r for r in runs}
    checks = []

    def check(goal: str, case: tuple, value: Optional[float], limit: float) -> None:
        checks.append(
            {
                "goal": goal,
                "algorithm": case[0],
                "execution": case[1],
                "value": None if value is None else round(value, 3),
                "limit": limit,
                "met": None if value is None else value <= limit,
            }
        )

    def figure(size: int, case: tuple, key: str) -> Optional[float]:
        return by_case.get((size, *case), {}).get(key)

    def ratio(top: Optional[float], bottom: Optional[float]) -> Optional[float]:
        return None if top is None or not bottom else top / bottom

    cases = sorted({(r["algorithm"], r["execution"]) for r in runs})
    sizes = {r["clients"] for r in runs}
    for case in cases:
        if {1000, 1_000_000} <= sizes:
            round_ratio = ratio(figure(1_000_000, case, "round_s"), figure(1000, case, "round_s"))
            check("s/round at 10^6 / at 10^3", case, round_ratio, 1.2)
        for size, limit in ((100_000, 10.0), (1_000_000, 60.0)):
            if size in sizes:
                check(f"start-up s at {size:,}", case, figure(size, case, "startup_s"), limit)
        if {10_000, 1_000_000} <= sizes:
            peak = ratio(figure(1_000_000, case, "peak_mb"), figure(10_000, case, "peak_mb"))
            check("peak memory at 10^6 / at 10^4", case, peak, 1.5)
        for size in sorted(sizes):
            evaluation = ratio(figure(size, case, "eval_s"), figure(size, case, "round_s"))
            check(f"s/evaluation / s/round at {size:,}", case, evaluation, 1.0)
            assign, whole = figure(size, case, "eval_assign_s"), figure(size, case, "eval_s")
            if assign and whole and assign >= 0.1 * whole:  # scoring alone, without cold start
                scoring = ratio(whole - assign, figure(size, case, "round_s"))
                check(f"s/scoring / s/round at {size:,}", case, scoring, 1.0)
    return checks
