"""The public path of model inspection's names (``rmsnorm.lab.inspection``): the code lives in
:mod:`rmsnorm.lab.experiments.inspection`."""

from .experiments.inspection import *  # noqa: F403
from .experiments.inspection import __all__  # noqa: F401
