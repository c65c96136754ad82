"""Your own callbacks (``trainer.callbacks`` in a config names them by class path); kiln's are in ``kiln.callbacks``."""

from research.callbacks.text_sample import TextSample

__all__ = ["TextSample"]
