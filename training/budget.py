"""`train.max_minutes`: turn a wall-clock budget into a step count, leaving warm-up out of the estimate.

The first steps of a run pay one-off costs (DataLoader workers starting, the first batch, cuDNN
autotuning, lazy CUDA initialisation, allocator growth), so a step time measured on them is far too
long: on an H100 the old estimate from steps 2-6 gave 161 steps of a 5-minute budget, trained in 31 s.
Here the step time is re-measured on a window that doubles (steps 1-5, 5-10, 10-20, 20-40, ... after
the first step) but ends at most half-way to the fitted end, each estimate from the latest window only,
and the step count is refitted after each window. The last windows are long and late, so the estimate ends on the
steady-state speed and a run uses close to its budget (tests/test_training.py checks 80-110 % under a slow start).

The budget covers the training loop (steps, checkpoints, validation), not start-up (building the
model, the image cache): those are reported in the log but are not what a step count can control.
"""

from __future__ import annotations

from dataclasses import dataclass

SAFETY = 0.97  # logging, the last checkpoint and validation run after the last step
FIRST_WINDOW = 5


@dataclass
class StepBudget:
    """Refits the number of steps that fit in ``seconds`` of loop time as steps are timed."""

    seconds: float
    cap: int  # the step count of epochs / max_steps: a budget never trains longer than that
    anchor_step: int | None = None  # start of the current timing window (after the run's first step)
    anchor_t: float = 0.0
    window: int = FIRST_WINDOW

    def observe(self, step: int, now: float, elapsed_s: float, total: int) -> int | None:
        """Call after each step with the time now and the loop time used so far (resumes included).

        Returns a new total step count at the end of a timing window, else None.
        """
        if self.anchor_step is None:  # the first step of this process: one-off costs, not timed
            self.anchor_step, self.anchor_t = step, now
            return None
        if step - self.anchor_step < self.window:
            return None
        per_step = (now - self.anchor_t) / (step - self.anchor_step)
        self.anchor_step, self.anchor_t = step, now
        fitted = fit_steps(step, per_step, self.seconds - elapsed_s, self.cap)
        # the next window doubles, but ends by half-way to the fitted end: a count fitted on slow
        # warm-up steps is corrected before the run stops on it
        self.window = min(2 * self.window, max(FIRST_WINDOW, (fitted - step) // 2))
        return fitted

    def done(self, step: int, total: int) -> bool:
        """No later window ends before the run does: the step count is final."""
        return step + self.window > total


def fit_steps(step: int, per_step: float, remaining_s: float, cap: int) -> int:
    """Steps done plus those that fit in ``remaining_s`` at ``per_step`` seconds each, at most ``cap``."""
    more = int(max(0.0, remaining_s) * SAFETY / max(per_step, 1e-9))
    return max(step, min(cap, step + more))
