"""Callbacks that watch a run: prediction files, run summaries."""

from kiln.callbacks.predictions import PredictionWriter

__all__ = ["PredictionWriter"]
