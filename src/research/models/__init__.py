"""LightningModules: loss, metrics, optimisation and logging around an injected network."""

from research.models.classifier import Classifier
from research.models.language_model import LanguageModel
from research.models.regressor import Regressor

__all__ = ["Classifier", "LanguageModel", "Regressor"]
