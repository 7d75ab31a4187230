"""Ops a graph may call: the NNEF standard set and the tract ops torchlower can meet.

``STANDARD`` is ``nnef.StandardOperations`` of the ``nnef`` package 1.0.10 (121 ops), copied so
reading an artifact needs no extra package. tract registries are open-ended, so their ops are
recognized by prefix; the few unprefixed tract primitives are listed in ``TRACT_EXTRA``.
"""

from __future__ import annotations

STANDARD = frozenset(
    """
    abs acos acosh add add_n all_reduce and any_reduce area_downsample argmax_pool argmax_reduce
    argmin_reduce asin asinh atan atanh avg_pool avg_roi_align avg_roi_pool avg_unpool
    batch_normalization box cast ceil clamp concat constant conv copy copy_n cos cosh debox deconv
    desample div elu eq exp external floor gather ge gelu gt l1_normalization l2_normalization le
    leaky_relu linear linear_quantize local_contrast_normalization local_mean_normalization
    local_response_normalization local_variance_normalization log log2 logarithmic_quantize lt
    matmul max max_pool max_pool_with_index max_reduce max_roi_align max_roi_pool max_unpool
    mean_reduce min min_max_linear_quantize min_reduce moments mul multilinear_upsample ne
    nearest_downsample nearest_upsample neg not or pad pow prelu rcp relu reshape rms_pool
    roi_resample round rsqr rsqrt sample select selu separable_conv separable_deconv sigmoid sign
    silu sin sinh slice softabs softmax softplus split sqr sqrt squeeze stack sub sum_reduce tan
    tanh tile transpose unsqueeze unstack update variable zero_point_linear_quantize
    """.split()  # noqa: SIM905 (one name per line would be 121 lines)
)

# unprefixed primitives of tract's NNEF registry (nnef/src/ops/nnef/mod.rs) beyond the standard
TRACT_EXTRA = frozenset({"square", "recip", "tract_shl", "tract_shr"})

TRACT_PREFIXES = ("tract_core_", "tract_transformers_", "tract_extra_", "tract_resource_", "tract_onnx_")


def is_known_op(op: str) -> bool:
    """True for standard NNEF ops, tract primitives and registry ops (by prefix)."""
    return op in STANDARD or op in TRACT_EXTRA or op.startswith(TRACT_PREFIXES)
