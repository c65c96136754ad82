"""A pretrained backbone from timm: weights from a local file or the local Hugging Face cache, fitted to the data."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import timm
from torch import Tensor, nn

from kiln.console import say
from kiln.errors import ConfigError, nearest

KEY = "model.net.init_args"
Stats = tuple[tuple[float, ...], tuple[float, ...]]  # (mean, std), one value per input channel
HUB = "hub"  # `weights: hub`: the name's own pretrained weights, through the Hugging Face cache


def _check_name(name: str) -> None:
    if not timm.is_model(name):
        arch = name.split(".", 1)[0]
        raise ConfigError(
            f"{KEY}.name: timm has no model {name!r}{nearest(arch, timm.list_models())} "
            f"(python -c \"import timm; print(timm.list_models('{arch[:4]}*'))\" lists them)"
        )


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


class Timm(nn.Module):
    """Any timm model as the network, its classifier sized by the data and its first convolution
    adapted to the data's channels (timm's own ``adapt_input_conv``: RGB weights summed for one
    channel, repeated and rescaled for more).

    Args:
        name: A ``timm.list_models()`` name, with a pretrained tag if wanted (``resnet18.a1_in1k``).
        num_classes: Classes of the new head; the CLI links it from the data.
        in_channels: Input channels; the CLI links it from the data.
        input_shape: One sample's shape; the CLI links it from the data. A model built for one image
            size (a ViT: ``fixed_input_size`` in its timm config) is built for the data's, its
            pretrained position embeddings resampled by timm.
        weights: ``None``: random initialisation. A file (``.safetensors``, ``.pth``, ``.bin``): its
            weights, as timm's pretrained loading reads them. ``hub``: the name's pretrained weights
            from the local Hugging Face cache (``HF_HUB_CACHE``), fetched into it if missing unless
            ``HF_HUB_OFFLINE=1``. A classifier of another size is left out and the head starts new.
        drop_rate: Dropout before the classifier (``None``: the model's default).
        drop_path_rate: Stochastic depth, for models that have it (``None``: the model's default).
    """

    # arguments that only initialise weights: a checkpoint, which holds them all, rebuilds without them
    init_only: ClassVar[tuple[str, ...]] = ("weights",)

    def __init__(
        self,
        name: str,
        num_classes: int,
        in_channels: int = 3,
        weights: str | None = None,
        input_shape: tuple[int, ...] | None = None,
        drop_rate: float | None = None,
        drop_path_rate: float | None = None,
    ) -> None:
        super().__init__()
        _check_name(name)
        if weights in ("None", "null", ""):  # jsonargparse 4.53 passes a flag's `null` here as the text "None"
            weights = None
        self.in_channels = in_channels
        options: dict[str, Any] = {"num_classes": num_classes, "in_chans": in_channels}
        options |= {"drop_rate": drop_rate, "drop_path_rate": drop_path_rate}  # timm leaves out the None ones
        cfg = timm.models.get_pretrained_cfg(name)
        if cfg is not None and cfg.fixed_input_size and input_shape is not None and len(input_shape) == 3:
            options["img_size"] = tuple(input_shape[1:])
        if weights is None:
            self.model = timm.create_model(name, **options)
            return
        overlay = None if weights == HUB else {"file": str(self._file(weights))}
        quiet = logging.getLogger("timm").level
        logging.getLogger("timm").setLevel(logging.WARNING)  # kiln says what was loaded, in one line
        try:
            self.model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **options)
        except Exception as err:
            raise ConfigError(self._load_failure(name, weights, err)) from None
        finally:
            logging.getLogger("timm").setLevel(quiet)
        say(self._loaded(name, weights))

    @staticmethod
    def _file(weights: str) -> Path:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{KEY}.weights: no file {weights} (give a .safetensors/.pth file, `hub` for the name's own "
                "pretrained weights, or null for a random initialisation; a resume may give null: the checkpoint "
                "holds every weight)"
            )
        return path

    @staticmethod
    def _load_failure(name: str, weights: str, err: BaseException) -> str:
        if weights != HUB:
            hint = "; a kiln checkpoint loads with --init_from" if weights.endswith(".ckpt") else ""
            return f"{KEY}.weights: {weights} does not fit timm {name}: {_first_line(err)}{hint}"
        repo = timm.models.get_pretrained_cfg(name)
        where = f"timm's {name} ({repo.hf_hub_id or repo.url})" if repo else f"timm's {name}"
        return (
            f"{KEY}.weights: hub: {where} is not in the local Hugging Face cache and could not be fetched "
            f"({_first_line(err)}); fetch it once on a machine with network (same HF_HUB_CACHE), or give a local file"
        )

    def _loaded(self, name: str, weights: str) -> str:
        cfg: dict[str, Any] = dict(getattr(self.model, "pretrained_cfg", {}))
        classes = int(getattr(self.model, "num_classes", 0))
        notes = []
        if self.in_channels != 3:
            notes.append(f"first convolution adapted from 3 to {self.in_channels} channels")
        if classes != cfg.get("num_classes"):
            notes.append(f"head new for {classes} classes")
        source = weights if weights != HUB else f"the Hugging Face cache ({cfg.get('hf_hub_id')})"
        return f"{KEY}: timm {name}, pretrained weights from {source}" + "".join(f"; {n}" for n in notes)

    @classmethod
    def input_stats(cls, init_args: Mapping[str, Any], in_channels: int | None) -> Stats | None:
        """The normalisation the pretrained weights expect, per input channel; ``None`` without weights.

        RGB statistics fit the adapted first convolution: their mean for one channel (whose
        weights are the RGB ones summed), repeated in the same order for more.
        """
        if not init_args.get("weights"):
            return None
        cfg = timm.models.get_pretrained_cfg(str(init_args.get("name")))
        if cfg is None or not cfg.mean or not cfg.std:
            return None
        mean, std = (tuple(float(v) for v in values) for values in (cfg.mean, cfg.std))
        channels = in_channels or len(mean)
        if channels == len(mean):
            return mean, std
        if channels == 1:
            return (round(sum(mean) / len(mean), 6),), (round(sum(std) / len(std), 6),)
        return tuple(mean[i % len(mean)] for i in range(channels)), tuple(std[i % len(std)] for i in range(channels))

    @property
    def head(self) -> nn.Module:
        """The classifier (timm's ``get_classifier``): the head of ``model.backbone_lr_ratio`` and freezing."""
        head: nn.Module = self.model.get_classifier()  # type: ignore[operator]
        return head

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)
