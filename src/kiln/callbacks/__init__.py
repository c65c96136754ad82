"""Callbacks that watch a run: health checks, pictures, prediction files."""

from kiln.callbacks.batch_checks import BatchSanityCheck
from kiln.callbacks.ema import EMA
from kiln.callbacks.grad_norm import GradNormMonitor
from kiln.callbacks.last import LastCheckpoint
from kiln.callbacks.mistakes import ConfidentMistakes
from kiln.callbacks.non_finite import NonFiniteGuard
from kiln.callbacks.overfit import OverfitReport
from kiln.callbacks.pictures import BatchGrid, ConfusionMatrixReport
from kiln.callbacks.predictions import PredictionWriter
from kiln.callbacks.preemption import PreemptionCheckpoint
from kiln.callbacks.progress import ProgressBar
from kiln.callbacks.resume import ExactResume
from kiln.callbacks.run_metrics import RunMetrics
from kiln.callbacks.speed import ChannelsLast, Compile
from kiln.callbacks.summary import ModelSummary
from kiln.callbacks.train_loss import TrainLoss

__all__ = [
    "EMA",
    "BatchGrid",
    "BatchSanityCheck",
    "ChannelsLast",
    "Compile",
    "ConfidentMistakes",
    "ConfusionMatrixReport",
    "ExactResume",
    "GradNormMonitor",
    "LastCheckpoint",
    "ModelSummary",
    "NonFiniteGuard",
    "OverfitReport",
    "PredictionWriter",
    "PreemptionCheckpoint",
    "ProgressBar",
    "RunMetrics",
    "TrainLoss",
]
