"""The public path of the training comparison's names (``rmsnorm.lab.comparison``): the code
lives in :mod:`rmsnorm.lab.experiments.comparison`."""

from .experiments.comparison import *  # noqa: F403
from .experiments.comparison import __all__  # noqa: F401
