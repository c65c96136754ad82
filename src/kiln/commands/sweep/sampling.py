"""A sampler seeded per trial: workers and reruns never draw alike, and a sweep run alone repeats from its seed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from optuna.samplers import BaseSampler


def trial_seed(seed: int, number: int) -> int:
    """Trial ``number``'s seed: mixed from (sweep seed, trial number), so neighbouring numbers draw apart."""
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class TrialSeeded(BaseSampler):
    """Draws trial ``n`` with a fresh inner sampler seeded from ``(seed, n)``.

    A sampler seeded once with a constant draws the same points in every worker of a study and again
    after a driver restarts (two workers on one journal study ran 4 trials with 2 distinct settings).
    Trial numbers are unique in a study, so seeding by them makes every trial's draw its own, while
    the same sweep file run alone gives the same trials. TPE fits its model to the study's history at
    each trial, so a new inner sampler per trial loses nothing.
    """

    def __init__(self, make: Callable[[int], BaseSampler], seed: int) -> None:
        self.make, self.seed = make, seed
        self.inner = make(trial_seed(seed, 0))

    def before_trial(self, study: Any, trial: Any) -> None:
        self.inner = self.make(trial_seed(self.seed, trial.number))
        self.inner.before_trial(study, trial)

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
