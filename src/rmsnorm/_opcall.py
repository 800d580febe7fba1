"""The custom ops ``torch.ops.rmsnorm.*`` called with :mod:`rmsnorm._launch`'s signatures: the one
place where the options value is flattened into the ops' schemas. Apart from :mod:`rmsnorm._ops`
(which registers the ops) so that the DTensor rules can call the ops without importing it."""

from __future__ import annotations

import torch


class call:
    """The ops with :mod:`rmsnorm._launch`'s signatures (options as one RMSOptions, gating as one
    GateOptions): what the functional API's op path, the ops' backward and
    :mod:`rmsnorm._dtensor` call. Here, and in the ops' schemas, the options are flattened;
    nowhere else."""

    @staticmethod
    def rms_norm_fwd(x, norm_dims, weight, bias, opts):
        return torch.ops.rmsnorm.rms_norm_fwd(x, norm_dims, weight, bias, *opts)

    @staticmethod
    def add_rms_norm_fwd(x, residual, norm_dims, weight, bias, opts):
        return torch.ops.rmsnorm.add_rms_norm_fwd(x, residual, norm_dims, weight, bias, *opts)

    @staticmethod
    def rms_norm_bwd(dy, x, norm_dims, weight, bias, rstd, dresidual, opts, input_dtype, need):
        return torch.ops.rmsnorm.rms_norm_bwd(
            dy, x, norm_dims, weight, bias, rstd, dresidual, *opts, input_dtype, need
        )

    @staticmethod
    def layer_norm_fwd(x, norm_dims, weight, bias, eps):
        return torch.ops.rmsnorm.layer_norm_fwd(x, norm_dims, weight, bias, eps)

    @staticmethod
    def layer_norm_bwd(dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad):
        return torch.ops.rmsnorm.layer_norm_bwd(
            dy, x, norm_dims, weight, bias, mean, rstd, need_weight_grad
        )

    @staticmethod
    def gated_rms_norm_fwd(x, gate, norm_dims, weight, bias, opts, gating, input_dtype):
        return torch.ops.rmsnorm.gated_rms_norm_fwd(
            x, gate, norm_dims, weight, bias, *opts, *gating, input_dtype
        )

    @staticmethod
    def gated_rms_norm_bwd(
        dy, x, gate, norm_dims, weight, bias, rstd, dresidual, opts, gating, input_dtype, need
    ):
        tensors = (dy, x, gate, norm_dims, weight, bias, rstd, dresidual)
        return torch.ops.rmsnorm.gated_rms_norm_bwd(*tensors, *opts, *gating, input_dtype, need)
