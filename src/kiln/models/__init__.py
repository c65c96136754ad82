"""LightningModules: loss, metrics, optimisation and logging around an injected network."""

from kiln.models.classifier import ImageClassifier
from kiln.models.schedules import WarmupCosineLR

__all__ = ["ImageClassifier", "WarmupCosineLR"]
