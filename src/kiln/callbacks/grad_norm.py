"""Log gradient norms without a per-step device sync, and warn on spikes."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import grad_norm
from torch import Tensor
from torch.optim import Optimizer

from kiln.console import say
from kiln.training.logging_steps import write_now, writes_logs_after


class StepGradientNorm:
    """The 2-norm of all gradients the optimizer is about to apply, on the device, computed once per step.

    NonFiniteGuard and GradNormMonitor both need it in ``on_before_optimizer_step``; each carries
    one as ``gradient_norm``, and both use the first one in the trainer's callback list
    (:func:`shared_gradient_norm`), so the second to ask gets it for free. The norm of each
    gradient comes with it (``per_tensor``), so a non-finite one can be named without a host sync.
    """

    def __init__(self) -> None:
        self._last: tuple[Optimizer, int, Tensor] | None = None
        self.params: list[Tensor] = []  # the parameters whose gradients ``per_tensor`` measures, in its order
        self.per_tensor: Tensor | None = None  # their 2-norms (float32, one device), or None across devices

    def __call__(self, trainer: Trainer, optimizer: Optimizer) -> Tensor | None:
        """``None`` when no parameter has a gradient."""
        if self._last is not None and self._last[0] is optimizer and self._last[1] == trainer.global_step:
            return self._last[2]
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return None
        if len({g.device for g in grads}) == 1:  # one kernel a dtype (clip_grad_norm_'s), then their norm
            norms = torch._foreach_norm(grads, 2.0)
            self.per_tensor = torch.stack([n.float() for n in norms]).detach()
            norm = torch.linalg.vector_norm(self.per_tensor)
        else:  # parameters on several devices: the total only
            self.per_tensor, norm = None, torch.nn.utils.get_total_norm(grads).detach()
        self._last = (optimizer, trainer.global_step, norm)
        return norm


def shared_gradient_norm(trainer: Trainer, own: StepGradientNorm) -> StepGradientNorm:
    """The first ``gradient_norm`` any of the trainer's callbacks carries (``own`` when none does)."""
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        found = getattr(callback, "gradient_norm", None)
        if isinstance(found, StepGradientNorm):
            return found
    return own


class GradNormMonitor(Callback):
    """Total gradient norm at every logging step, per-parameter norms every ``layer_every_n_steps`` (at that step).

    The norm of every step is kept on the device for the spike check, which moves them to the host
    once every ``check_every_n_steps``; Lightning reads logged tensors only when it writes logs. Steps
    whose norm exceeds ``spike_factor`` times the running median of earlier steps are counted and
    reported in one line at the end of training (norms are measured before clipping, after AMP
    unscaling): a healthy run has a few, and a line per spike buried the console.

    Args:
        layer_every_n_steps: Period of the per-parameter norms (0 turns them off).
        check_every_n_steps: Period of the spike check (one host sync each).
        spike_factor: How many times the running median counts as a spike.
        history: Number of recent steps forming the running median.
    """

    def __init__(
        self,
        layer_every_n_steps: int = 100,
        check_every_n_steps: int = 50,
        spike_factor: float = 10.0,
        history: int = 200,
    ) -> None:
        self.layer_every_n_steps = layer_every_n_steps
        self.check_every_n_steps = check_every_n_steps
        self.spike_factor = spike_factor
        self.history = history
        self._pending: list[Tensor] = []
        self._past: list[float] = []
        self.spikes: list[tuple[int, float, float]] = []  # (step, norm, median)
        self.gradient_norm = StepGradientNorm()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer) -> None:
        total = shared_gradient_norm(trainer, self.gradient_norm)(trainer, optimizer)
        if total is None:
            return
        step = trainer.global_step
        if writes_logs_after(trainer, step):
            pl_module.log("grad/total_norm", total, on_step=True, on_epoch=False)
        if self.layer_every_n_steps and step % self.layer_every_n_steps == 0 and trainer.is_global_zero:
            self._log_layers(trainer, pl_module, step)
        self._pending.append(total)
        if len(self._pending) >= self.check_every_n_steps:
            self._check_spikes(step)

    @staticmethod
    def _log_layers(trainer: Trainer, pl_module: LightningModule, step: int) -> None:
        """Each parameter's gradient norm, written to the loggers at this step alone: through ``self.log`` Lightning
        would write the same values again at every later logging step of the epoch, as if measured there."""
        norms = grad_norm(pl_module, norm_type=2, group_separator="/")
        norms.pop("grad_2.0_norm_total", None)
        write_now(trainer, {k.replace("grad_2.0_norm/", "grad/"): v for k, v in norms.items()}, step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._pending:
            self._check_spikes(trainer.global_step - 1)
        if report := self.report():
            say(report)

    def report(self) -> str | None:
        """One line on this run's gradient-norm spikes, if any: how many, the first and the largest."""
        if not self.spikes:
            return None
        first, largest = self.spikes[0], max(self.spikes, key=lambda s: s[1] / s[2])
        return (
            f"gradient norm spikes (over {self.spike_factor:g}x the running median) at {len(self.spikes)} "
            f"step{'s' if len(self.spikes) > 1 else ''}: the first at step {first[0]}, the largest "
            f"{largest[1] / largest[2]:.0f}x at step {largest[0]}; harmless if the loss recovered (grad/total_norm)"
        )

    def _check_spikes(self, last_step: int) -> None:
        values = torch.stack(self._pending).float().cpu().tolist()  # the one host sync per period
        first_step = last_step - len(values) + 1
        self._pending.clear()
        for offset, value in enumerate(values):
            if not math.isfinite(value):  # NonFiniteGuard's to report; kept out of the running median
                continue
            if len(self._past) >= 10:
                median = sorted(self._past)[len(self._past) // 2]
                if value > self.spike_factor * median:
                    self.spikes.append((first_step + offset, value, median))
            self._past = [*self._past, value][-self.history :]

    def state_dict(self) -> dict[str, Any]:
        return {"past": list(self._past)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._past = list(state_dict["past"])
