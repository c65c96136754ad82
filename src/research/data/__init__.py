"""The data: LightningDataModules that declare what they produce (classes, sample shape, statistics)."""

from research.data.digits import DigitsDataModule
from research.data.friedman import FriedmanDataModule
from research.data.sentences import SentencesDataModule
from research.data.waveforms import WaveformsDataModule

__all__ = ["DigitsDataModule", "FriedmanDataModule", "SentencesDataModule", "WaveformsDataModule"]
