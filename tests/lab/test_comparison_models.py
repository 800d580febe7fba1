"""Models that differ only in the norm (lab/comparison/models.py): bit-identical shared
parameters, norm parameters at their own init, and the fingerprint that checks it."""

import torch

from rmsnorm.lab.comparison import (
    build_models,
    fingerprint,
    norm_parameter_names,
    shared_parameters,
)
from rmsnorm.lab.transformer import TransformerConfig


def test_variants_differ_only_in_the_norm():
    cfg = TransformerConfig(n_layers=2, d_model=24, n_heads=2, seq_len=8)
    models = build_models(cfg, ["layernorm", "rmsnorm", "prmsnorm", "none"], seed=3)
    template = shared_parameters(models["none"])
    assert norm_parameter_names(models["none"]) == set()
    n_norms = 2 * cfg.n_layers + 1  # two per block and the final one (pre-norm)
    expected_norm_params = {
        "layernorm": 2 * cfg.d_model * n_norms,  # γ and β
        "rmsnorm": cfg.d_model * n_norms,  # γ
        "prmsnorm": cfg.d_model * n_norms,
        "none": 0,
    }
    total_none = sum(p.numel() for p in models["none"].parameters())
    for variant, model in models.items():
        shared = shared_parameters(model)
        assert shared.keys() == template.keys()
        for name, p in shared.items():
            assert torch.equal(p, template[name]), (variant, name)
        total = sum(p.numel() for p in model.parameters())
        assert model.norm_parameter_count() == expected_norm_params[variant]
        assert total - total_none == expected_norm_params[variant]
        assert fingerprint(shared) == fingerprint(template)
        # the norms start at their own init: γ = 1, β = 0
        for name, p in model.named_parameters():
            if name in norm_parameter_names(model):
                assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
