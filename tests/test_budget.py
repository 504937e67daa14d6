"""train.max_minutes: the step count fitted from timed windows that leave warm-up out (training/budget.py).

A synthetic clock drives StepBudget exactly as training/loop.py does, so the checks are deterministic.
"""

from __future__ import annotations

import pytest

from medclr.training.budget import SAFETY, StepBudget, fit_steps


def simulate(step_time, budget_s: float, cap: int = 10**9, tail_s: float = 0.5) -> tuple[int, float]:
    """Run the loop's protocol on a clock that advances by step_time(step); return (steps, loop seconds)."""
    budget, total, step, t = StepBudget(budget_s, cap), cap, 0, 0.0
    while step < total:
        t += step_time(step + 1)
        step += 1
        if budget is not None:
            fitted = budget.observe(step, t, t, total)
            if fitted is not None:
                total = fitted
                if budget.done(step, total):
                    budget = None
    return step, t + tail_s  # the last checkpoint after the loop


@pytest.mark.parametrize("name, step_time", [
    ("steady", lambda k: 0.5),
    ("slow first step (workers, first batch)", lambda k: 20.0 if k == 1 else 0.5),
    ("cuDNN autotuning: 12 slow steps", lambda k: 3.0 if k <= 12 else 0.1),
    ("GPU after CPU-like start", lambda k: 1.79 if k <= 6 else 0.05),
    ("a checkpoint every 50 steps", lambda k: 0.2 + (3.0 if k % 50 == 0 else 0.0)),
])
def test_a_run_uses_80_to_110_percent_of_its_budget(name, step_time):
    for minutes in (1, 5):
        steps, used = simulate(step_time, minutes * 60.0)
        assert 0.8 * minutes * 60 <= used <= 1.1 * minutes * 60, (name, minutes, steps, used)


def test_old_estimate_would_have_stopped_early():
    """The H100 case of the issue: steps 2-6 at 1.79 s then 0.05 s. Fitting once on steps 2-6 (the old
    rule) gives ~170 steps = 31 s of a 300 s budget; the refitted windows use the budget."""
    once = fit_steps(6, 1.79, 300.0 - 1.79 * 6, 10**9)
    assert once * 0.05 < 0.2 * 300
    steps, used = simulate(lambda k: 1.79 if k <= 6 else 0.05, 300.0)
    assert steps > 10 * once and used >= 0.8 * 300


def test_budget_never_exceeds_the_configured_steps():
    steps, used = simulate(lambda k: 0.01, 600.0, cap=300)
    assert steps == 300 and used < 10


def test_fit_steps_formula():
    assert fit_steps(10, 0.5, 100.0, 10**6) == 10 + int(100.0 * SAFETY / 0.5)
    assert fit_steps(10, 0.5, -5.0, 10**6) == 10  # over budget: stop now
    assert fit_steps(10, 0.5, 100.0, 50) == 50
