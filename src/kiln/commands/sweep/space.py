"""A sweep file: the search space over the CLI's own dotted keys, the objective, and how many trials."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kiln.errors import UsageError
from kiln.files import load_yaml

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")


@dataclass
class Param:
    """One dimension: a float or int range (``log`` scale or linear, optional ``step``), or ``choices``."""

    key: str
    kind: Literal["float", "int", "categorical"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: list[Any] | None = None

    def suggest(self, trial: Any) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, self.choices)
        if self.kind == "int":
            low, high = int(self.low or 0), int(self.high or 0)
            return trial.suggest_int(self.key, low, high, step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)

    def distribution(self) -> Any:
        """The Optuna distribution :meth:`suggest` draws from (what a study records for each trial)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "categorical":
            return CategoricalDistribution(self.choices or [])
        if self.kind == "int":
            return IntDistribution(int(self.low or 0), int(self.high or 0), log=self.log, step=int(self.step or 1))
        return FloatDistribution(float(self.low or 0), float(self.high or 0), log=self.log, step=self.step)


@dataclass
class Sweep:
    """What ``kiln sweep -c <file>`` reads (see ``configs/sweep/``)."""

    name: str
    metric: str = "val/loss"
    direction: Literal["minimize", "maximize"] = "minimize"
    n_trials: int = 20
    sampler: str = "tpe"
    pruner: str = "median"
    pruner_startup_trials: int = 5  # trials that run to the end before the median pruner stops any
    pruner_warmup_epochs: int = 1  # epochs of each trial before it may be stopped
    seed: int = 0  # the sampler's
    args: list[str] = field(default_factory=list)  # `kiln fit` arguments every trial gets (presets, flags)
    enqueue: list[dict[str, Any]] = field(default_factory=list)  # values to try first (known-good settings)
    space: list[Param] = field(default_factory=list)
    file: str = ""  # where it was read from (a trial in its own process reads it again)
    stale_after: float = 300.0  # --stale_after: a trial whose heartbeat is older is taken for dead (its worker)


def _param(where: str, key: str, raw: Any) -> Param:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: space.{key}: give {{low: …, high: …}} (log, step optional) or {{choices: […]}}")
    unknown = set(raw) - {"low", "high", "log", "step", "choices"}
    if unknown:
        raise UsageError(f"{where}: space.{key}: unknown {sorted(unknown)}; use low, high, log, step or choices")
    if "choices" in raw:
        if not isinstance(raw["choices"], list) or not raw["choices"]:
            raise UsageError(f"{where}: space.{key}.choices: give a non-empty list")
        return Param(key, "categorical", choices=raw["choices"])
    if "low" not in raw or "high" not in raw:
        raise UsageError(f"{where}: space.{key}: needs low and high (or choices)")
    low, high = raw["low"], raw["high"]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)) or low >= high:
        raise UsageError(f"{where}: space.{key}: low {low!r} and high {high!r} must be numbers with low < high")
    if raw.get("log") and low <= 0:
        raise UsageError(f"{where}: space.{key}: a log scale needs low > 0 (got {low})")
    kind: Literal["float", "int"] = "int" if isinstance(low, int) and isinstance(high, int) else "float"
    return Param(key, kind, float(low), float(high), bool(raw.get("log", False)), raw.get("step"))


def read_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file; any mistake is one line naming the file and the key."""
    where = str(path)
    try:
        raw = load_yaml(Path(path).read_text()) or {}
    except OSError:
        raise UsageError(f"{where}: no such sweep file") from None
    except yaml.YAMLError as err:
        raise UsageError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    known = {"name", "metric", "direction", "n_trials", "sampler", "pruner", "pruner_startup_trials",
             "pruner_warmup_epochs", "seed", "args", "enqueue", "space"}  # fmt: skip
    if unknown := sorted(set(raw) - known):
        raise UsageError(f"{where}: unknown keys {unknown}; a sweep file has {', '.join(sorted(known))}")
    if not raw.get("name") or not raw.get("space"):
        raise UsageError(f"{where}: needs a name and a space (dotted CLI keys with their ranges)")
    sweep = Sweep(**{k: v for k, v in raw.items() if k != "space"})
    sweep.space = [_param(where, key, value) for key, value in raw["space"].items()]
    sweep.file = str(Path(path).resolve())
    if sweep.direction not in ("minimize", "maximize"):
        raise UsageError(f"{where}: direction: {sweep.direction!r}; use minimize or maximize")
    if sweep.sampler not in SAMPLERS or sweep.pruner not in PRUNERS:
        raise UsageError(f"{where}: sampler must be one of {SAMPLERS} and pruner one of {PRUNERS}")
    keys = {param.key for param in sweep.space}
    for values in sweep.enqueue:
        if not isinstance(values, dict) or not set(values) <= keys:
            raise UsageError(f"{where}: enqueue: {values!r}; give values for keys of the space ({', '.join(keys)})")
    if not isinstance(sweep.n_trials, int) or sweep.n_trials < 1:
        raise UsageError(f"{where}: n_trials: {sweep.n_trials!r}; give a positive integer")
    return sweep


def flags(values: dict[str, Any]) -> list[str]:
    """The trial's values as ``--key=value`` arguments, the form ``wandb agent`` passes too."""
    return [f"--{key}={value}" for key, value in values.items()]


def wandb_config(sweep: Sweep) -> dict[str, Any]:
    """The same sweep for ``wandb sweep``: its agent runs ``kiln fit`` with the ``--key=value`` flags it builds."""
    parameters: dict[str, Any] = {}
    for param in sweep.space:
        if param.kind == "categorical":
            parameters[param.key] = {"values": param.choices}
        elif param.kind == "int" and param.step not in (None, 1):
            low, high, step = int(param.low or 0), int(param.high or 0), int(param.step or 1)
            parameters[param.key] = {"values": list(range(low, high + 1, step))}
        elif param.kind == "int":
            parameters[param.key] = {
                "distribution": "int_uniform",
                "min": int(param.low or 0),
                "max": int(param.high or 0),
            }
        else:
            parameters[param.key] = {"distribution": "log_uniform_values" if param.log else "uniform",
                                     "min": param.low, "max": param.high}  # fmt: skip
    rendered = {
        "name": sweep.name,
        "method": "bayes" if sweep.sampler == "tpe" else "random",
        "metric": {"name": sweep.metric, "goal": sweep.direction},
        "parameters": parameters,
        "command": ["${env}", "kiln", "fit", *sweep.args, "${args}"],
    }
    if sweep.pruner == "median":  # W&B has no median rule: its hyperband stops runs from the same warm-up on
        rendered["early_terminate"] = {"type": "hyperband", "min_iter": sweep.pruner_warmup_epochs + 1}
    return rendered
