"""Exact LayerNorm → RMSNorm conversion of pre-LN transformers (Jiang et al., NeurIPS 2023,
"Pre-RMSNorm and Pre-CRMSNorm Transformers"): the supported architectures as one table
(``architectures``), the conversion that reads it (``exact``) and the tool that converts, saves and
checks model directories (``checkpoint``, what ``rmsnorm convert`` runs)."""

from .architectures import ARCHITECTURES, Architecture, ConversionError
from .checkpoint import (
    ConversionReport,
    convert_directory,
    load_model,
    random_tokens,
    save_model,
    time_inference,
    verify_conversion,
)
from .exact import layernorm_to_rmsnorm, recenter_, residual_writers

__all__ = [
    "ConversionError",
    "layernorm_to_rmsnorm",
    "recenter_",
    "residual_writers",
    "verify_conversion",
    "time_inference",
    "save_model",
    "load_model",
    "convert_directory",
    "ConversionReport",
    "random_tokens",
    "Architecture",
    "ARCHITECTURES",
]
