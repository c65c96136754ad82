"""LightningModules: loss, metrics, optimisation and logging around an injected network."""

from research.models.classifier import Classifier

__all__ = ["Classifier"]
