"""Resuming with changed model or data settings: refused in one line, never silently ignored."""

from __future__ import annotations

from typing import Any

from jsonargparse import Namespace

from kiln.cli.classes import import_class, is_a
from kiln.cli.links import link_targets
from kiln.errors import ConfigError
from kiln.files import load_yaml
from kiln.process.secrets import REDACTED
from kiln.runs.folders import layout, run_of
from kiln.training import contracts

# settings that change speed or memory, not the computation: a resume may change them
RUNTIME_ONLY = {
    "fused",
    "foreach",
    "activation_checkpointing",
}


def init_only(class_path: Any) -> tuple[str, ...]:
    """A network class's arguments that only initialise its weights (``Timm``'s ``weights``): a checkpoint,
    which holds every weight, makes them irrelevant when it is loaded."""
    return contracts.init_only(import_class(str(class_path)))


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): list(value) if isinstance(value, tuple) else value}


def saved_model(hparams: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint hyper-parameters keyed as the CLI's ``model`` config is."""
    init = {k: v for k, v in hparams.items() if not k.startswith("_")}
    return flat({"class_path": hparams.get("_class_path"), "init_args": init}, "model.")


def refuse_changed_settings(hparams: dict[str, Any], model: Namespace, ckpt_path: str) -> None:
    """Stop before training when the command builds another model than the checkpoint's.

    Lightning would rebuild the checkpoint's model and ignore the command's values (and a restored
    optimizer keeps its old learning rate), so a change would be silently lost.
    """
    if not hparams.get("_class_path"):
        return  # not saved by the CLI: nothing to compare
    saved, given = saved_model(hparams), flat(model, "model.")
    weights_only = {
        f"model.init_args.net.init_args.{name}" for name in init_only(given.get("model.init_args.net.class_path"))
    }
    linked = link_targets()
    changed = [
        (key, saved[key], value)
        for key, value in given.items()
        if key in saved and saved[key] != value and saved[key] != REDACTED
        and key.rsplit(".", 1)[-1] not in RUNTIME_ONLY and key not in linked  # linked from the data
        and key not in weights_only  # the weights a net starts from: the checkpoint's replace them
    ]  # fmt: skip
    if not changed:
        return
    key, before, after = changed[0]
    more = f" (and {len(changed) - 1} more: {', '.join(k for k, _, _ in changed[1:])})" if len(changed) > 1 else ""
    raise ConfigError(
        f"{key}: the checkpoint {ckpt_path} was trained with {before!r}, this command gives {after!r}{more}; "
        "a resume keeps the checkpoint's model and optimizer, so drop the change (or its -c file), "
        "or start a new run without --ckpt_path"
    )


def refuse_fewer_epochs(checkpoint: dict[str, Any], max_epochs: int | None, ckpt_path: str) -> None:
    """A resume whose ``max_epochs`` is below the epochs the checkpoint has trained: Lightning stops on it deep in
    its restore (an internal error before)."""
    done = checkpoint.get("epoch")
    if max_epochs is None or max_epochs == -1 or not isinstance(done, int) or done <= max_epochs:
        return
    raise ConfigError(
        f"--trainer.max_epochs {max_epochs}: the checkpoint {ckpt_path} has trained {done} epochs already; give "
        f"at least {done} to resume it, or drop --ckpt_path for a new run"
    )


# data settings that change how batches are made, not which samples: a resume may change them (docs/faults.md:
# another batch size neither replays nor skips data)
DATA_RUNTIME = {"batch_size", "eval_batch_size", "num_workers", "on_device", "cache", "scan", "download",
                "predict_dir", "imbalance"}  # fmt: skip


def refuse_changed_data(hparams: dict[str, Any] | None, data: Namespace, ckpt_path: str) -> None:
    """Stop before training when the command's data is not the checkpoint's: a resume onto other data
    would go on training the weights on it and report a mix of both as one run."""
    if not hparams or not hparams.get("_class_path") or not isinstance(data, Namespace):
        return  # not saved by the CLI: nothing to compare
    saved_class, given_class = str(hparams["_class_path"]), str(data.get("class_path"))
    if import_class(saved_class) is not import_class(given_class):
        raise ConfigError(
            f"data: the checkpoint {ckpt_path} was trained on {saved_class}, this command gives {given_class}; a "
            "resume goes on with the same data, so drop the data change (or its -c file), or start a new run "
            "without --ckpt_path (--init_from <checkpoint> fine-tunes its weights on other data)"
        )
    init = {k: v for k, v in hparams.items() if not k.startswith("_")}
    saved, given = flat(init, "data.init_args."), flat(data.get("init_args") or {}, "data.init_args.")
    changed = [
        (key, saved[key], value)
        for key, value in given.items()
        if key in saved and saved[key] != value and key.rsplit(".", 1)[-1] not in DATA_RUNTIME
        and not (value is None and key.endswith(".classes"))  # recorded by the run; None: found again
        and "Unable to serialize" not in repr(saved[key])  # a value Lightning's hparams dump could not keep
    ]  # fmt: skip
    if changed:
        key, before, after = changed[0]
        raise ConfigError(
            f"{key}: the checkpoint {ckpt_path} was trained with {before!r}, this command gives {after!r}; a "
            "resume goes on with the same data, so drop the change, or start a new run without --ckpt_path"
        )


def average_dropped(checkpoint: dict[str, Any], callbacks: Any) -> bool:
    """Whether the checkpoint's weights are an average (EMA: its ``state_dict``) and the configured callbacks
    average no more."""
    from lightning.pytorch.callbacks import WeightAveraging

    return "current_model_state" in checkpoint and not any(is_a(c, WeightAveraging) for c in callbacks or ())


def refuse_dropped_average(checkpoint: dict[str, Any], callbacks: Any, ckpt_path: str) -> None:
    """Stop before training when the command drops the checkpoint's weight averaging: Lightning would go on
    training from the average, not from the weights trained."""
    if not average_dropped(checkpoint, callbacks):
        return
    raise ConfigError(
        f"trainer.callbacks: the checkpoint {ckpt_path} was trained with weight averaging (kiln.callbacks.EMA), "
        "which this command leaves out; a resume without it would go on from the average, not from the weights "
        "trained: add it again (-c configs/callbacks/ema.yaml), or start a new run from the average with "
        f"--init_from {ckpt_path}"
    )


def average_line(checkpoint: dict[str, Any], callbacks: Any, subcommand: str, ckpt_path: str) -> str | None:
    """What validate/test/predict score of an EMA checkpoint without EMA: its average (its ``state_dict``)."""
    if not average_dropped(checkpoint, callbacks):
        return None
    raw = " (-c configs/callbacks/ema.yaml also tests the weights trained, as test_raw/...)"
    return f"weights: the EMA average {ckpt_path} holds, as the fit validated and tested them" + (
        raw if subcommand == "test" else "")  # fmt: skip


def keep_run_seed(config: Namespace, ckpt_path: str) -> None:
    """A resume goes on with its run's seed, which its data order and augmentation follow: another is refused
    (the run would mix two seeds, and its config.yaml would name only the second); ``true`` (any) takes the run's."""
    saved_config = layout(run_of(ckpt_path)).config
    try:
        saved = (load_yaml(saved_config.read_text()) or {}).get("seed_everything") if saved_config.is_file() else None
    except (OSError, ValueError):
        return
    given = config.get("seed_everything")
    if not isinstance(saved, int) or isinstance(saved, bool) or given == saved:
        return
    if given is True:
        config.seed_everything = saved
        return
    raise ConfigError(
        f"seed_everything: the run of {ckpt_path} was trained with {saved}, this command gives {given}; a resume "
        "goes on with the run's seed (its data order and augmentation follow it), so drop the change, or start a "
        "new run without --ckpt_path"
    )


def keep_saved_stats(hparams: dict[str, Any] | None, data: Namespace) -> None:
    """A resume normalises as the run did: the checkpoint's ``mean``/``std`` where the command sets none (with a
    pretrained net's ``weights: null``, which a resume may give, they would fall back to the data's defaults)."""
    if not hparams or not isinstance(data, Namespace) or not isinstance(data.get("init_args"), Namespace):
        return
    for key in ("mean", "std"):
        if data.init_args.get(key) is None and hparams.get(key) is not None:
            data.init_args[key] = hparams[key]


def keep_given_secrets(hparams: dict[str, Any], given: Namespace, merged: Namespace) -> None:
    """Where the checkpoint holds a redacted secret, keep the value the command line gave."""
    for key, value in saved_model(hparams).items():
        if value == REDACTED:
            name = key.removeprefix("model.")
            if name in given:
                merged[name] = given[name]


def check_resume(checkpoint: dict[str, Any], config: Namespace) -> None:
    """A ``fit`` resuming ``checkpoint`` with the command's ``config``: refused where it would change what the
    checkpoint trained (model settings, data, the weight average, fewer epochs), its seed and data statistics kept."""
    ckpt_path = config.ckpt_path
    refuse_changed_settings(checkpoint.get("hyper_parameters", {}), config.model, ckpt_path)
    keep_saved_stats(checkpoint.get("datamodule_hyper_parameters"), config.data)
    refuse_changed_data(checkpoint.get("datamodule_hyper_parameters"), config.data, ckpt_path)
    refuse_dropped_average(checkpoint, config.trainer.callbacks, ckpt_path)
    refuse_fewer_epochs(checkpoint, config.trainer.max_epochs, ckpt_path)
    keep_run_seed(config, ckpt_path)
