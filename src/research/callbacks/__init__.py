"""Your own callbacks (``trainer.callbacks`` in a config names them by class path); kiln's are in ``kiln.callbacks``."""
