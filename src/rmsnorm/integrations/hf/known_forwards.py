"""The known normalization forwards: each written once, the way transformers 5.24 writes it, with
its convention and the class it was taken from. A class whose forward is one of them (as code, see
:mod:`.recognition`) is patched with that convention; one that is a known refusal is not."""

from __future__ import annotations

from .conventions import NAMED_CONVENTIONS, Convention

__all__ = ["KNOWN_FORWARDS", "KNOWN_REFUSALS"]


# Each entry: ("model.Class" it was taken from, i.e. transformers.models.<model>.modeling_<model>
# .<Class>; its convention; its source: forward and the methods of its own that forward calls
# through self). A gated forward takes (hidden_states, gate); its patched forward takes the same
# two. The sources read torch, nn, F and, in the gated ones, transformers' ACT2FN.
_NORM_HELPER = """
def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
"""

# LlamaRMSNorm's normalizing lines, which four other known forwards (OLMo 2's, Helium's and the
# gated Qwen3-Next's and Kimi-Linear's) share word for word; they differ in what follows.
_LLAMA_NORMALIZATION = """
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
"""


def _after_llama_normalization(signature: str, *statements: str) -> str:
    """The source of ``def forward<signature>:`` running Llama's normalizing lines, then
    ``statements``, one a line."""
    return f"def forward{signature}:{_LLAMA_NORMALIZATION}" + "".join(
        f"    {line}\n" for line in statements
    )


def _gemma3n(eps_attr: str) -> str:
    """Gemma 3n's forward, with ε read from ``eps_attr`` (transformers 5.24: ``eps``; 5.25:
    ``variance_epsilon``)."""
    return f"""
def forward(self, hidden_states):
    normed_output = self._norm(hidden_states.float())
    if self.with_scale:
        normed_output = normed_output * self.weight.float()
    return normed_output.type_as(hidden_states)

def _norm(self, hidden_states):
    mean_squared = hidden_states.pow(2).mean(-1, keepdim=True) + self.{eps_attr}
    return hidden_states * torch.pow(mean_squared, -0.5)
"""


KNOWN_FORWARDS: tuple[tuple[str, Convention, str], ...] = (
    (
        "llama.LlamaRMSNorm",
        NAMED_CONVENTIONS["llama"],
        _after_llama_normalization(
            "(self, hidden_states)", "return self.weight * hidden_states.to(input_dtype)"
        ),
    ),
    (
        "gemma.GemmaRMSNorm",
        NAMED_CONVENTIONS["gemma"],
        """
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        "olmo2.Olmo2RMSNorm",
        NAMED_CONVENTIONS["olmo2"],
        _after_llama_normalization(
            "(self, hidden_states)", "return (self.weight * hidden_states).to(input_dtype)"
        ),
    ),
    (
        "helium.HeliumRMSNorm",
        NAMED_CONVENTIONS["olmo2"],
        _after_llama_normalization(
            "(self, hidden_states)",
            "return (self.weight.to(torch.float32) * hidden_states).to(input_dtype)",
        ),
    ),
    (
        "t5.T5LayerNorm",
        NAMED_CONVENTIONS["t5"],
        """
def forward(self, hidden_states):
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states
""",
    ),
    (
        "gemma3n.Gemma3nRMSNorm",  # no offset; the weight only where with_scale is True
        Convention("rms", "eps", weight_flag="with_scale"),
        _gemma3n("eps"),
    ),
    (
        # The same, as transformers 5.25 writes it (ε in variance_epsilon).
        "gemma3n.Gemma3nRMSNorm",
        Convention("rms", "variance_epsilon", weight_flag="with_scale"),
        _gemma3n("variance_epsilon"),
    ),
    (
        "moshi.MoshiRMSNorm",
        Convention("rms", "eps"),
        """
def forward(self, x):
    output = self._norm(x.float())
    output = output * self.weight.float()
    return output.type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        "llama4.Llama4TextRMSNorm",
        Convention("rms", "eps", "llama"),
        """
def forward(self, x):
    output = self._norm(x.float()).type_as(x)
    return output * self.weight
"""
        + _NORM_HELPER,
    ),
    (
        # x / sqrt(mean(x²) + ε) · weight, all in the input dtype: "llama" computes x̂ in fp32 and
        # rounds it to the input dtype before the weight, so it is the same in fp32 and closer to
        # exact in half precision, with the same output dtype.
        "imagegpt.ImageGPTLayerNorm",
        Convention("rms", "eps", "llama"),
        """
def forward(self, tensor):
    tensor = tensor / torch.sqrt(torch.mean(torch.square(tensor), axis=-1, keepdim=True) + self.eps)
    tensor = tensor * self.weight
    return tensor
""",
    ),
    (
        "nanochat.NanoChatRMSNorm",  # no weight
        Convention("rms", "eps", weight=False),
        """
def forward(self, x):
    return self._norm(x.float()).type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        # The same, as transformers 5.25 writes it (ε in variance_epsilon); Llama 4's and
        # Falcon-Mamba's weightless norms are copies of it.
        "nanochat.NanoChatRMSNorm",
        Convention("rms", "variance_epsilon", weight=False),
        """
def forward(self, x):
    return self._norm(x.float()).type_as(x)

def _norm(self, x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
""",
    ),
    (
        "inkling2.Inkling2UnweightedRMSNorm",
        Convention("rms", "eps", weight=False),
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.float()
    hidden_states = hidden_states * torch.rsqrt(hidden_states.square().mean(-1, keepdim=True) + self.eps)
    return hidden_states.to(input_dtype)
""",  # noqa: E501
    ),
    (
        # r in fp32, rounded to the input dtype, x·r in the input dtype: casting_mode "none".
        "deepseek_v4.DeepseekV4UnweightedRMSNorm",
        Convention("rms", "eps", "none", weight=False),
        """
def forward(self, x):
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps).to(x.dtype)
""",
    ),
    (
        "cohere.CohereLayerNorm",  # LayerNorm without bias, fp32 throughout, cast at the end
        Convention("layer", "variance_epsilon"),
        """
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    mean = hidden_states.mean(-1, keepdim=True)
    variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
    hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight.to(torch.float32) * hidden_states
    return hidden_states.to(input_dtype)
""",
    ),
    (
        # Gemma's convention per group of self.group_size (None: the whole row).
        "qwen4_exp.Qwen4ExpTextRMSNorm",
        Convention("rms", "eps", offset=1.0, group_size_attr="group_size"),
        """
def _norm(self, x):
    if self.group_size is not None:
        x = x.reshape(*x.shape[:-1], -1, self.group_size)
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    return out.flatten(-2) if self.group_size is not None else out

def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight.float())
    return output.type_as(x)
""",
    ),
    (
        # Gemma's, but 1 + weight is summed in the weight's dtype before .float().
        "muse_spark.MuseSparkTextCenteredRMSNorm",
        Convention("rms", "eps", offset=1.0, offset_in_weight_dtype=True),
        """
def forward(self, x):
    output = self._norm(x.float())
    output = output * (1.0 + self.weight).float()
    return output.type_as(x)
"""
        + _NORM_HELPER,
    ),
    (
        # Llama's with an optional weight and bias; force_float32_reductions=False reduces in the
        # input dtype (refused).
        "xlstm.xLSTMRMSNorm",
        Convention(
            "rms",
            "eps",
            "llama",
            bias=True,
            optional_params=True,
            fp32_reductions_attr="force_float32_reductions",
        ),
        """
def _apply_weight_bias(self, x):
    if self.weight is not None:
        x = x * self.weight
    if self.bias is not None:
        x = x + self.bias
    return x

def _rms_normalize(self, x):
    in_dtype = x.dtype
    if self.force_float32_reductions:
        x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
    return x.to(in_dtype)

def forward(self, x):
    x = self._rms_normalize(x)
    x = self._apply_weight_bias(x)
    return x
""",
    ),
    (
        "qwen3_next.Qwen3NextRMSNormGated",
        NAMED_CONVENTIONS["qwen3_next_gated"],
        _after_llama_normalization(
            "(self, hidden_states, gate)",
            "hidden_states = self.weight * hidden_states.to(input_dtype)",
            "hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))",
            "return hidden_states.to(input_dtype)",
        ),
    ),
    (
        "kimi_linear.KimiLinearRMSNormGated",
        NAMED_CONVENTIONS["kimi_linear_gated"],
        _after_llama_normalization(
            "(self, hidden_states, gate=None)",
            "hidden_states = self.weight.to(torch.float32) * hidden_states",
            "hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))",
            "return hidden_states.to(input_dtype)",
        ),
    ),
    (
        "mamba2.MambaRMSNormGated",
        NAMED_CONVENTIONS["mamba2_gated"],
        """
def forward(self, hidden_states, gate=None):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    if gate is not None:
        hidden_states = hidden_states * nn.functional.silu(gate.to(torch.float32))
    *prefix_dims, last_dim = hidden_states.shape
    group_count = last_dim // self.group_size
    hidden_states_group = hidden_states.view(*prefix_dims, group_count, self.group_size)
    variance = hidden_states_group.pow(2).mean(-1, keepdim=True)
    hidden_states_group = hidden_states_group * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = hidden_states_group.view(*prefix_dims, group_count * self.group_size)
    return self.weight * hidden_states.to(input_dtype)
""",
    ),
    (
        "falcon_h1.FalconH1RMSNormGated",
        NAMED_CONVENTIONS["falcon_h1_gated"],
        """
def forward(self, hidden_states, gate=None):
    input_dtype = hidden_states.dtype
    input_ndim = hidden_states.ndim
    if not self.norm_before_gate and gate is not None:
        hidden_states = hidden_states * F.silu(gate.to(torch.float32))
    if len(hidden_states.shape) == 3:
        batch_size, seq_len, dim = hidden_states.shape
    else:
        batch_size, dim = hidden_states.shape
        seq_len = 1
    hidden_states = hidden_states.to(torch.float32)
    hidden_states = hidden_states.view(batch_size, seq_len, self.n_groups, int(dim // self.n_groups))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight.view(self.n_groups, int(dim // self.n_groups)) * hidden_states
    hidden_states = hidden_states.view(batch_size, seq_len, dim)
    if input_ndim == 2:
        hidden_states = hidden_states.squeeze(1)
    if self.norm_before_gate and gate is not None:
        hidden_states = hidden_states * F.silu(gate.to(torch.float32))
    return hidden_states.to(input_dtype)
""",  # noqa: E501
    ),
    (
        "olmo.OlmoLayerNorm",  # LayerNorm without parameters, ε fixed at 1e-5
        Convention("layer", None, weight=False, eps=1e-5, shape_attr="normalized_shape"),
        """
def forward(self, hidden_states):
    orig_dtype = hidden_states.dtype
    return F.layer_norm(hidden_states.to(dtype=torch.float32), self.normalized_shape, None, None, eps=1e-5).to(orig_dtype)
""",  # noqa: E501
    ),
)

# Known forwards that are refused, with the reason, so that the warning says what they are.
KNOWN_REFUSALS: tuple[tuple[str, str, str], ...] = (
    (
        "axk2.AXK2GatedRMSNorm",
        "it is a container, not one norm: it returns y = self.norm(x), an RMSNorm patched on its "
        "own, times a sigmoid gate that self.mlp computes from y, which no single call of this "
        "library computes",
        """
def forward(self, x):
    y = self.norm(x)
    return (y * torch.sigmoid(self.mlp(y).float())).to(y.dtype)
""",
    ),
)
