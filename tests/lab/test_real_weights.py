"""The real-model path end to end on SmolLM2 when its weights are installed (``make test``'s
set-up installs them): load with the digest checks, statistics at every norm site, the centering's
cost on a few held-out windows. Small sizes: this checks the path, not the report's numbers."""

from __future__ import annotations

import math

import pytest

from rmsnorm.lab.experiments import centering, sites
from rmsnorm.lab.models import pretrained, weights
from rmsnorm.lab.models.text import stdlib_docstrings

pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

if not all(
    weights._installed_version(p) == p.version for p in weights.BUILTIN["smollm2-135m"].packages
):
    pytest.skip(
        "smollm2-135m's weights are not installed (rmsnorm weights install smollm2-135m)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # dequantized once, into this run's own cache
        mp.setenv("RMSNORM_CACHE", str(tmp_path_factory.mktemp("cache")))
        return pretrained.load_pretrained("smollm2-135m")


def test_smollm2_sites_and_centering(smollm2):
    assert type(smollm2.model).__name__ == "LlamaForCausalLM" and not smollm2.encoder
    assert "Q4_1, dequantized" in smollm2.provenance["format"]
    source = stdlib_docstrings()
    study = sites.site_study(smollm2, source, sequences=2, seq_len=32)
    kinds = [s["kind"] for s in study["sites"]]
    assert kinds.count("pre-norm") == 60 and kinds.count("final") == 1
    assert all(s["width"] == 576 for s in study["sites"])
    # the residual stream's largest activation sits on the first token in the second half
    late = [s for s in study["sites"] if s["layer"] is not None and s["layer"] >= 12]
    assert all(s["max_abs_first_token"] > s["max_abs_other_tokens"] for s in late)
    found = sites.find_sites(smollm2.model)
    chosen = centering.standard_variants(found, [0])
    cost = centering.causal_swap_study(smollm2, source, sequences=2, seq_len=32, variants=chosen)
    assert set(cost["variants"]) == {"all", "kind:pre-norm", "kind:final", "block:0"}
    kl = cost["variants"]["all"]["kl"]
    assert len(kl) == 2 and all(math.isfinite(v) and v > 0 for v in kl)
    assert all(0 < v < 10 for v in cost["reference"]["ce"])
    # the massive channels the statistics name are large on the typical token
    assert any(s["massive"] for s in study["sites"])
