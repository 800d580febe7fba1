"""The public path of the simulation's names (``rmsnorm.lab.simulation``): the code lives in
:mod:`rmsnorm.lab.experiments.simulation`."""

from .experiments.simulation import *  # noqa: F403
from .experiments.simulation import __all__  # noqa: F401
