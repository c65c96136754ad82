"""Lightning's Rich model summary, which never prints FLOPs it did not count."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

NOT_COUNTED = "Total FLOPs: not counted (the module has no example_input_array)"


class ModelSummary(RichModelSummary):
    """Lightning's ``RichModelSummary``; for a module without ``example_input_array``, whose FLOPs Lightning cannot
    count and prints as 0 (per layer and in total), one line saying they were not counted instead.

    Args:
        max_depth: Depth of the layers listed (``-1``: all, ``0``: no summary).
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        super().__init__(max_depth, **summarize_kwargs)
        self._counted = True

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._counted = pl_module.example_input_array is not None
        super().on_fit_start(trainer, pl_module)

    def summarize(  # type: ignore[override]  # Lightning's is a staticmethod, called on the instance
        self,
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if self._counted:
            RichModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                       total_training_modes, total_flops, **summarize_kwargs)  # fmt: skip
            return
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(
                name, justify="right" if name == "Params" else "left", style="dim" if name == " " else None
            )
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        frozen = total_parameters - trainable_parameters
        lines = [f"Trainable params: {_count(trainable_parameters)}",
                 f"Non-trainable params: {_count(frozen)}",
                 f"Total params: {_count(total_parameters)}",
                 f"Total estimated model params size (MB): {get_formatted_model_size(model_size)}",
                 f"Modules in train mode: {total_training_modes['train']}",
                 f"Modules in eval mode: {total_training_modes['eval']}", NOT_COUNTED]  # fmt: skip
        console = get_console()
        console.print(table)
        console.print("\n".join(lines), highlight=False)


def _count(number: int) -> str:
    return str(get_human_readable_count(int(number))).strip()
