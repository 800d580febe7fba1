"""The lab's statistics. Per-row μ, σ, RMS and how far LayerNorm and RMSNorm outputs diverge
(:mod:`.rows`, whose names this package exports: ``rmsnorm.lab.stats.row_stats``); |μ|/σ of
i.i.d. Gaussian rows, the chance level every measurement is set against (:mod:`.iid`); where the
mean comes from (:mod:`.decomposition`); per-channel outliers and the blind spot of |μ|/σ
(:mod:`.outliers`); the ε and β conventions (:mod:`.conventions`); the statistics of one norm
site of a pretrained model with bootstrap intervals (:mod:`.sitestats`); intervals for a mean
cost over a few sequences, with their measured coverage (:mod:`.intervals`); and whether a
per-block statistic predicts a cost (:mod:`.predict`)."""

from . import rows
from .rows import *  # noqa: F403

__all__ = rows.__all__
