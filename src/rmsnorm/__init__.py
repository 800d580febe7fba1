"""rmsnorm: Root Mean Square Layer Normalization (Zhang & Sennrich, 2019) as fused kernels, drop-in
modules and a lab that measures when RMSNorm can replace LayerNorm.

Importing this package never imports triton or transformers.
"""

from ._backend import use_backend
from ._calls import last_calls, set_debug
from .functional import add_rms_norm, gated_rms_norm, layer_norm, rms_norm
from .modules import AddRMSNorm, GatedRMSNorm, LayerNorm, RMSNorm

__version__ = "0.1.0"

__all__ = [
    "rms_norm",
    "add_rms_norm",
    "gated_rms_norm",
    "layer_norm",
    "RMSNorm",
    "AddRMSNorm",
    "GatedRMSNorm",
    "LayerNorm",
    "use_backend",
    "set_debug",
    "last_calls",
    "__version__",
]
