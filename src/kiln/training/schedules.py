"""Learning-rate schedules that torch does not ship as a single class."""

from __future__ import annotations

import math
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from kiln.console import say
from kiln.errors import ConfigError


class WarmupCosineLR(LambdaLR):
    """Linear warm-up from ~0 to the base LR, then cosine decay to ``min_lr_ratio`` x base LR.

    Step it every optimizer step. With ``total_steps=None``, :func:`optimization` (a module's
    ``configure_optimizers``) calls :meth:`set_total_steps` with the Trainer's estimate, so the
    schedule follows ``max_epochs`` without editing YAML.

    Args:
        optimizer: The wrapped optimizer.
        warmup_fraction: Share of ``total_steps`` spent warming up.
        total_steps: Length of the schedule in optimizer steps.
        min_lr_ratio: Final LR as a fraction of the base LR.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_fraction: float = 0.05,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
    ) -> None:
        if not 0 <= warmup_fraction < 1:
            raise ConfigError(
                f"WarmupCosineLR: warmup_fraction {warmup_fraction} must be in [0, 1), a share of the schedule's steps "
                "(model.init_args.scheduler.init_args.warmup_fraction)"
            )
        self.warmup_fraction = warmup_fraction
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio
        self._follows_trainer = False  # total_steps came from the Trainer's estimate, not from the user
        super().__init__(optimizer, self.factor)

    def set_total_steps(self, total_steps: int) -> None:
        """Fix the schedule length after construction and reset the current LR to step 0's."""
        self.total_steps, self._follows_trainer = total_steps, True
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * self.factor(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def factor(self, step: int) -> float:
        total = self.total_steps or 1
        warmup = int(self.warmup_fraction * total)
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the position; a length taken from the Trainer follows the resumed run's, which may
        train longer (a restored old length would hold the learning rate at 0 for the added steps)."""
        total, follows = self.total_steps, self._follows_trainer
        super().load_state_dict(state_dict)
        if follows and total != self.total_steps:
            say(f"learning-rate schedule: {total} steps for this run (the checkpoint's run had {self.total_steps})")
            self.total_steps, self._follows_trainer = total, True


def optimization(trainer: Any, optimizer: Optimizer, scheduler: Any, interval: str = "step") -> Any:
    """What ``configure_optimizers`` returns for an optimizer and the scheduler a config built for it (``None``:
    a constant LR): a ``WarmupCosineLR`` without a length runs as long as the Trainer's run, and is refused in one
    line when stepped per epoch (its length is in optimizer steps)."""
    if scheduler is None:
        return optimizer
    if isinstance(scheduler, WarmupCosineLR) and interval != "step":
        raise ConfigError(
            "model.scheduler_interval: epoch steps WarmupCosineLR once per epoch, but its length is in optimizer "
            "steps: the warm-up would span the whole run and the learning rate never decay. Use "
            "scheduler_interval: step, or a per-epoch schedule (torch.optim.lr_scheduler.CosineAnnealingLR)"
        )
    if isinstance(scheduler, WarmupCosineLR) and scheduler.total_steps is None:
        steps = trainer.estimated_stepping_batches
        if not math.isfinite(steps):
            raise ConfigError(
                "WarmupCosineLR takes its length from the run, which has no end (trainer.max_epochs -1, no "
                "max_steps): give trainer.max_steps or a positive max_epochs, or the schedule's total_steps"
            )
        scheduler.set_total_steps(int(steps))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}
