"""LightningModules: loss, metrics, optimisation and logging around an injected network."""

from kiln.models.classifier import Classifier
from kiln.models.schedules import WarmupCosineLR

__all__ = ["Classifier", "WarmupCosineLR"]
