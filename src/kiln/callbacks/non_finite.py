"""Stop (or skip) a training step whose loss or gradients are NaN/Inf, before it touches the weights."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from torch.optim import Optimizer

from kiln.callbacks.grad_norm import StepGradientNorm, shared_gradient_norm
from kiln.errors import ConfigError, HealthCheckError


def _has_grad_scaler(trainer: Trainer) -> bool:
    """fp16 mixed precision: the GradScaler skips overflowing steps itself and lowers its scale."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None


def _is_fused(optimizer: Optimizer) -> bool:
    """torch's fused kernels (``fused=True``) skip a step on the device when ``optimizer.found_inf`` is 1."""
    return bool(optimizer.defaults.get("fused"))


class NonFiniteGuard(Callback):
    """Checks each step's loss and gradients just before the optimizer step.

    Lightning by default trains on with NaN weights. Here a non-finite step either stops the run
    with an error naming the step and its loss (``action="stop"``), or is skipped, counted and
    logged as ``health/skipped_steps`` (``action="skip"``) until more than ``max_skips`` steps were
    skipped. The weights and every checkpoint keep the last finite state.

    Two ways to check. Immediate: the verdict is read on the host every step, so ``stop`` stops at
    the bad step itself; on a GPU that is a device sync per step, which stalls the queue of
    kernels. Deferred (on CUDA with a fused optimizer, as in the default experiment): the verdict
    goes to the optimizer as ``found_inf``, the tensor a GradScaler uses, so the fused kernel leaves
    weights and optimizer state untouched on a bad step without the host waiting; the step, its
    loss and its first non-finite gradient are kept on the device, and the host reads them every
    ``check_every_n_steps`` steps, before every checkpoint and at each epoch end, so ``stop``
    stops within that many steps of the bad one, which the weights never took. Either way the
    error names the step, its loss and the first parameter with a non-finite gradient.

    Args:
        action: ``stop`` at the first non-finite step, ``skip`` it, or ``off``.
        max_skips: With ``skip``: the number of skipped steps tolerated before stopping.
        mode: Where the verdict is read: ``auto`` defers it on CUDA with a fused optimizer,
            ``device`` defers it wherever the optimizer is fused (``fused: true`` in its init_args;
            refused otherwise), ``host`` reads it every step (immediate).
        check_every_n_steps: With deferred checking: how often the host reads the verdicts.
    """

    def __init__(
        self,
        action: Literal["stop", "skip", "off"] = "stop",
        max_skips: int = 10,
        mode: Literal["auto", "device", "host"] = "auto",
        check_every_n_steps: int = 50,
    ) -> None:
        self.action = action
        self.max_skips = max_skips
        self.mode = mode
        self.check_every_n_steps = check_every_n_steps
        self.skipped = 0
        self._loss: Tensor | None = None
        self._bad: Tensor | None = None  # deferred: non-finite steps so far, on the device
        # deferred, on the device: the non-finite step that goes past what the action allows (the first for
        # `stop`, the one after max_skips for `skip`): its number, loss, and first non-finite gradient as
        # (parameter list, position) in `_param_lists`
        self._over_step = self._over_loss = self._over_list = self._over_param = torch.zeros(())
        self._param_lists: dict[tuple[int, ...], int] = {}
        self._params_by_list: list[list[Tensor]] = []
        self._read_at = -1  # deferred: the step of the last read
        self._logged = 0  # deferred: the count last logged
        self._stop: str | None = None  # deferred: why the run stops, found while a checkpoint was written
        self._optimizers: list[Optimizer] = []
        self._buffers: list[tuple[Tensor, Tensor]] = []  # skip: (buffer, its value at the window start)
        self._trainer: Trainer | None = None
        self.gradient_norm = StepGradientNorm()
        # whether the latest optimizer step was skipped: a bool on the host, a 0-d tensor on the device (deferred);
        # weight averaging (kiln.callbacks.EMA) leaves its average as it is for such a step
        self.step_skipped: bool | Tensor = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict (called for every checkpoint) gets no trainer

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # skip: a skipped step must leave the whole state as before it, and the forward pass has already
        # moved BatchNorm's running statistics; keep them from the start of each accumulation window
        if self.action == "skip" and batch_idx % trainer.accumulate_grad_batches == 0:
            self._buffers = [(b, b.detach().clone()) for b in pl_module.buffers()]

    def _restore_buffers(self, bad: Tensor | None = None) -> None:
        """Put the buffers back as they were before the window; with ``bad`` (on the device) only if it is set."""
        with torch.no_grad():
            for buffer, saved in self._buffers:
                buffer.copy_(saved if bad is None else torch.where(bad, saved, buffer))

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Tensor) -> None:
        self._loss = loss.detach() if self.action != "off" else None

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer) -> None:
        self.step_skipped = False
        if self.action == "off":
            return
        scaler = _has_grad_scaler(trainer)
        norm = None if scaler else shared_gradient_norm(trainer, self.gradient_norm)(trainer, optimizer)
        if norm is None and self._loss is None:
            return
        # one scalar: NaN or Inf in the loss or any gradient makes the sum non-finite
        total = (norm if norm is not None else 0.0) + (self._loss.float() if self._loss is not None else 0.0)
        if not scaler and self._deferred(pl_module, optimizer):
            self._mark_on_device(trainer, optimizer, torch.as_tensor(total), norm is not None)
            return
        if bool(torch.isfinite(torch.as_tensor(total))):
            return
        message = self._describe(trainer, pl_module)
        if self.action == "skip" and self.skipped < self.max_skips:
            self.skipped += 1
            self.step_skipped = True
            optimizer.zero_grad(set_to_none=True)  # parameters without gradients are left untouched
            self._restore_buffers()
            self._logged = self.skipped
            pl_module.log("health/skipped_steps", float(self.skipped), on_step=True, on_epoch=False)
            return
        if self.action == "skip":
            message += f"; {self.skipped} steps were already skipped (max_skips={self.max_skips})"
        raise HealthCheckError(message)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        unfused = [type(o).__name__ for o in trainer.optimizers if not _is_fused(o)]
        if self.mode == "device" and self.action != "off" and unfused:
            raise ConfigError(
                f"non_finite.mode=device needs a fused optimizer, and {unfused[0]} is not: set fused: true in "
                "the optimizer's init_args (AdamW, Adam, SGD and Adagrad have one), or non_finite.mode: auto"
            )

    def _deferred(self, pl_module: LightningModule, optimizer: Optimizer) -> bool:
        if self.mode == "host" or not _is_fused(optimizer):
            return False
        return self.mode == "device" or pl_module.device.type == "cuda"

    def _mark_on_device(self, trainer: Trainer, optimizer: Optimizer, total: Tensor, has_grads: bool) -> None:
        """Hand the verdict to the fused step and keep count and the details, all on the device: no host sync."""
        bad = ~torch.isfinite(total)
        self.step_skipped = bad
        optimizer.found_inf = bad.float()  # type: ignore[attr-defined]  # the fused step skips itself on 1
        if optimizer not in self._optimizers:
            self._optimizers.append(optimizer)
        if self._bad is None:
            device = bad.device
            self._bad = torch.full((), self.skipped, dtype=torch.long, device=device)
            self._over_step, self._over_list, self._over_param = (
                torch.full((), -1, dtype=torch.long, device=device) for _ in range(3)
            )
            self._over_loss = torch.full((), float("nan"), device=device)
        self._bad += bad
        allowed = self.max_skips if self.action == "skip" else 0
        over = bad & (self._bad == allowed + 1)  # true at one step only: the count moves by one at most
        self._over_step = torch.where(over, trainer.global_step, self._over_step)  # a scalar: no copy
        if self._loss is not None:
            self._over_loss = torch.where(over, self._loss.float(), self._over_loss)
        gradients = shared_gradient_norm(trainer, self.gradient_norm)
        if has_grads and gradients.per_tensor is not None:
            nonfinite = ~torch.isfinite(gradients.per_tensor)
            first = torch.where(nonfinite.any(), nonfinite.int().argmax(), -1)  # argmax: the first maximum
            self._over_param = torch.where(over, first, self._over_param)
            self._over_list = torch.where(over, self._list_number(gradients.params), self._over_list)
        if self.action == "skip":
            self._restore_buffers(bad)  # on the device: no sync

    def _list_number(self, params: list[Tensor]) -> int:
        """A number for this list of parameters (the same list each step, but for freezing), to name one later."""
        key = tuple(map(id, params))
        if key not in self._param_lists:
            self._param_lists[key] = len(self._params_by_list)
            self._params_by_list.append(params)
        return self._param_lists[key]

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self._stop is not None:
            self._read_verdicts()  # a stop found while a checkpoint was being written
        if self._bad is None or step % self.check_every_n_steps or step == self._read_at:
            return
        self._read_verdicts()
        if self.skipped != self._logged:  # also counts read for a checkpoint in between
            self._logged = self.skipped
            pl_module.log("health/skipped_steps", float(self.skipped), on_step=True, on_epoch=False)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._read_verdicts()

    def _read_verdicts(self, stop_now: bool = True) -> None:
        """Deferred checking: move the count to the host (one sync) and act on new non-finite steps;
        with ``stop_now=False`` (inside a checkpoint's ``state_dict``) a stop is kept for the next call."""
        if self._stop is not None and stop_now:
            raise HealthCheckError(self._stop)
        if self._bad is None:
            return
        count = int(self._bad)
        self._read_at = self._trainer.global_step if self._trainer is not None else -1
        if count == self.skipped:
            return
        already, self.skipped = self.skipped, count
        if self.action == "skip" and count <= self.max_skips:
            return
        step, loss = int(self._over_step), float(self._over_loss)
        message = (
            f"non-finite training step {step} (loss={loss}, {self._over_gradient()}; found at step "
            f"{self._read_at}, as the host reads every {self.check_every_n_steps} steps): the fused optimizer "
            "skipped it on the device, so the weights never took it and no checkpoint holds it. Try a lower "
            "learning rate, gradient clipping, or `-c configs/debug/anomaly.yaml` to find the operation that "
            "produced it"
        )
        if self.action == "skip":
            message += f"; {self.max_skips} steps were already skipped (max_skips={self.max_skips})"
        elif count - already > 1:
            message += f"; {count - already} non-finite steps since the last read"
        self._stop = message
        if stop_now:
            raise HealthCheckError(message)

    def _over_gradient(self) -> str:
        """``first non-finite gradient: <name>`` of the step kept on the device, or that its gradients were finite."""
        listed, position = int(self._over_list), int(self._over_param)
        if listed < 0 or position < 0 or self._trainer is None:
            return "gradients finite"
        param = self._params_by_list[listed][position]
        names = {id(p): n for n, p in self._trainer.lightning_module.named_parameters()}
        return f"first non-finite gradient: {names.get(id(param), 'a parameter outside the model')}"

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for optimizer in self._optimizers:  # leave the optimizer as it was given
            if hasattr(optimizer, "found_inf"):
                del optimizer.found_inf
        self._optimizers.clear()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")

    def _describe(self, trainer: Trainer, pl_module: LightningModule) -> str:
        loss = float(self._loss) if self._loss is not None else float("nan")
        bad = next(
            (n for n, p in pl_module.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()),
            None,
        )
        grads = f"first non-finite gradient: {bad}" if bad else "gradients finite"
        return (
            f"non-finite training step {trainer.global_step} (epoch {trainer.current_epoch}, "
            f"batch {trainer.fit_loop.epoch_loop.batch_idx}): loss={loss}, {grads}. The weights were not "
            "updated and no checkpoint holds this step. Try a lower learning rate, gradient clipping, or "
            "`-c configs/debug/anomaly.yaml` to find the operation that produced it"
        )

    def state_dict(self) -> dict[str, Any]:
        self._read_verdicts(stop_now=False)  # the count a checkpoint holds is current; a stop waits for a hook
        return {"skipped": self.skipped}

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._read_verdicts()  # runs before the checkpoint callbacks' epoch-end saves (Lightning orders them last)
        if self.skipped != self._logged:  # deferred: counts read since the last log (host mode logs at the step)
            self._logged = self.skipped
            pl_module.log("health/skipped_steps", float(self.skipped), on_step=False, on_epoch=True)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._read_verdicts()  # before ModelCheckpoint's save at validation end

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = state_dict["skipped"]
