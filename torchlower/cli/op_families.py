"""Which family an NNEF / tract op belongs to, and its colour in pictures.

tract's registries are open-ended (``tract_core_*``, ``tract_transformers_*``,
``tract_extra_*``), so the family is found from the op's bare name: the registry prefix and any
``<generic>`` are dropped, then exact names are looked up, then keywords (``sdpa``, ``norm``,
``pool``…). Fragments called by name (``lstm``, ``layer_norm`` from torch_to_nnef) get a family
the same way. Only a name that matches nothing is ``other``.
"""

from __future__ import annotations

import re

COLORS = {
    "input": "#b7e1a1",
    "weight": "#e0e0e0",
    "linear": "#8ecae6",
    "attention": "#f28482",
    "recurrent": "#b5838d",
    "normalization": "#cdb4db",
    "activation": "#ffb703",
    "pooling": "#90be6d",
    "reduction": "#e9c46a",
    "layout": "#f4a261",
    "logic": "#a8dadc",
    "signal": "#9bf6ff",
    "quantization": "#d4a373",
    "arithmetic": "#ffe5b4",
    "module": "#dde5f4",  # a collapsed block of ops
    "other": "#ffffff",
}

_EXACT: dict[str, frozenset[str]] = {
    family: frozenset(names.split())
    for family, names in {
        "input": "external",
        "weight": "variable constant",
        "linear": "conv deconv matmul linear separable_conv separable_deconv einsum einsum_q qconv"
        " qmatmul causal_conv1d_update",
        "activation": "relu sigmoid tanh elu selu gelu silu softplus leaky_relu prelu clamp softmax"
        " log_softmax hard_swish softabs erf gelu_approx",
        "layout": "reshape transpose squeeze unsqueeze concat split slice dyn_slice stack unstack pad"
        " tile copy copy_n gather gather_elements gather_nd scatter_elements scatter_nd broadcast"
        " shape_of range one_hot trilu cast update complex_to_inner_dim inner_dim_to_complex literal"
        " alias",
        "logic": "eq ne lt gt le ge and or not xor bitand bitor bitxor bitnot is_nan is_inf select sign",
        "signal": "fft stft",
        "reduction": "topk",
        "arithmetic": "add sub mul div pow min max abs neg rcp recip exp log log2 sin cos tan asin acos"
        " atan sinh cosh asinh acosh atanh sqr square sqrt rsqr rsqrt floor ceil round round_even trunc"
        " add_n pow_const shl shr",
    }.items()
}
_KEYWORDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (family, re.compile(pattern))
    for family, pattern in (
        ("attention", r"sdpa|attention|attn|kv_cache|rope|masked_softmax"),
        ("recurrent", r"scan|lstm|gru|rnn|gdn|submodel|loop"),
        ("quantization", r"quantize"),
        ("normalization", r"norm|moments"),
        ("pooling", r"pool|sample|resize|^box$|^debox$|roi|downsample"),
        ("reduction", r"_reduce(_last)?$|^argm(ax|in)"),
    )
)
_PREFIX = re.compile(r"^(tract_core_|tract_transformers_|tract_extra_|tract_resource_|tract_)")


def bare(op: str) -> str:
    """``tract_core_gather<scalar>`` → ``gather``."""
    return _PREFIX.sub("", op.split("<")[0])


def family(op: str) -> str:
    name = bare(op)
    for fam, names in _EXACT.items():
        if name in names:
            return fam
    for fam, pattern in _KEYWORDS:
        if pattern.search(name):
            return fam
    return "other"


def color(fam: str) -> str:
    return COLORS.get(fam, COLORS["other"])
