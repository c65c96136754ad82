"""Lightning messages a kiln run prints for no reason, each dropped by its exact text (not a blanket filter)."""

from __future__ import annotations

import logging
import warnings

# (logger, start of the message, why it goes)
UNHELPFUL = [
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging",
     "an advertisement for another product, printed on every run without LitLogger"),
]  # fmt: skip


# (category, message regex, module regex, why it goes): warnings from dependencies that kiln cannot fix
DEPENDENCY_WARNINGS = [
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree",
     "Lightning 2.6 builds torch's deprecated LeafSpec in every batch transfer; Lightning must change, not kiln"),
    (UserWarning, r"The dirpath has changed from", r"lightning\.pytorch\.callbacks\.model_checkpoint",
     "validate/test/predict from a checkpoint run in their own folder (a resume keeps its folder): nothing is lost"),
]  # fmt: skip


class _DropUnhelpful(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_lightning() -> None:
    """Drop the messages in ``UNHELPFUL`` and ``DEPENDENCY_WARNINGS``; every other message is kept."""
    for category, message, module, _ in DEPENDENCY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in {logger for logger, _, _ in UNHELPFUL}:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropUnhelpful) for f in log.filters):
            log.addFilter(_DropUnhelpful(tuple(start for logger, start, _ in UNHELPFUL if logger == name)))
