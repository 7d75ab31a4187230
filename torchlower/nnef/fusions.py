"""Fusions: op chains rewritten into one tract kernel where tract runs that kernel faster.

Run at the end of ``passes.optimize`` (tract graphs in f32 only; quantized graphs are left alone).
Each fusion is scoped to the shapes where it was measured faster, and only fires where the fused
kernel computes what the chain computes (see each docstring).

- ``fuse_attention``: ``softmax(q·kᵀ · scale [+ mask]) · v`` → ``tract_transformers_sdpa``, which
  tract lowers to its flash-attention kernel. Measured single-threaded (tract 0.23.9, 4 heads of
  16, interleaved medians) against the chain as ``rows.py`` writes its softmax: 0.79× at 16²,
  0.82× at 32², but 1.2× at 48² and 1.4× at 64² (its 32×32 tiles are ndarray dots, not tract's
  packed matmuls), so it fires up to ``MAX_FLASH_AREA``; a mask with a whole 32×32 tile at
  ≤ -65504 (causal) lets the kernel skip that tile: 0.77× at 48², 0.84× at 64², so such masks
  fuse up to ``MAX_FLASH_AREA_SKIPPING``. A dense random mask: 0.85× at 32², 1.19× at 48².
  A decoder step's cross-attention (a symbolic query length S, no mask, at least
  ``MIN_DECODE_KEYS`` keys and values that are graph values, not weights) fuses too: tract packs
  both operands of a non-constant matmul on every call, where the flash kernel reads each key
  and value once; at 6 heads of 64 over 1,500 keys it ran 0.61× the chain at S = 1 and 0.55× at
  S = 4, 0.90× at 16 (1.6× at 64: prefill of a long prompt, once per utterance).
- then ``rows.apply``: last-axis softmax and max in the forms tract runs fastest (``nnef/rows.py``);
- then ``norms.centre_by_sum``: a layer norm's centring as ``n·x - Σx``, which tract fuses
  (``nnef/norms.py``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment
MAX_FLASH_AREA = 32 * 32  # query length × key length up to which flash SDPA beat matmul+softmax
MAX_FLASH_AREA_SKIPPING = 64 * 64  # the same with a mask that has a whole skipped tile (causal)
MIN_DECODE_KEYS = 256  # keys from which flash beat the chain at a symbolic query length (decode)
_TILE, _SKIP_BELOW = 32, -65503.0  # tract's flash tile size and the mask level where it skips one
# tract's flash kernel skips a 32×32 tile whose mask entries are all below -65503; a row whose
# largest mask entry is at least this keeps every skipped entry ≥ 55 000 below its maximum, so
# its weight exp(entry - max) is exactly 0 in f32, as in the unfused softmax
_ROW_FLOOR = -1e4
# a masked_fill value this low gives the same softmax as adding it (both weights are exactly 0)
_FILL_CEILING = -1e9


def apply(b: NNEFBuilder) -> bool:
    if not b.tract or b.precision != "f32" or b.quantization:
        return False
    from torchlower.nnef import norms, rows

    changed = fuse_attention(b)
    changed |= rows.apply(b)
    return norms.centre_by_sum(b) or changed


def fuse_attention(b: NNEFBuilder) -> bool:
    """``matmul(softmax(mask(scale(matmul(q, k, transposeB)))), v)`` → one ``tract_transformers_sdpa``.

    Fires when q, k, v have static f32 shapes ``[..., L, D]``, ``[..., S, D]``, ``[..., S, D]``
    with equal batch axes, every intermediate has one use, and the mask (if any) is a constant
    that as an additive mask has no row without an attended key (tract's kernel returns 0 for
    such rows where the chain returns a uniform average); ``-inf`` becomes the lowest finite
    float (tract's tile update turns an all ``-inf`` tile row into NaN).
    """
    producers, uses = edit.producers(b), edit.uses(b)
    changed = False

    def step(a: Assignment, out: list[Assignment]) -> bool:
        nonlocal changed
        match = _match(b, a, producers, uses)
        if match is None:
            out.append(a)
            return False
        q, k, v, scale, mask = match
        args: list[Any] = [q, k, v]
        if mask is not None:
            value, define = edit.variable(b, mask, f"constants/{a.outputs[0].name}_mask")
            out.append(define)
            args.append(value)
        attrs = {"scale": scale, "datum_type": "f32", "acc_datum_type": "f32", "is_causal": False}
        out.append(Assignment(a.outputs, "tract_transformers_sdpa", args, attrs))
        changed = True
        return True

    edit.rewrite(b, step)
    if changed:
        b.use_extension("tract_registry tract_transformers")
    return changed


def _single(producers: dict[str, Assignment], uses: dict[str, int], x: Any) -> Assignment | None:
    """The producer of ``x`` when ``x`` is a value read once (so its chain can go)."""
    if not isinstance(x, Value) or uses[x.name] != 1:
        return None
    return producers.get(x.name)


def _match(
    b: NNEFBuilder, pv: Assignment, producers: dict[str, Assignment], uses: dict[str, int]
) -> tuple[Value, Value, Value, float, torch.Tensor | None] | None:
    if pv.op != "matmul" or len(pv.args) != 2 or pv.attrs.get("transposeA") or pv.attrs.get("transposeB"):
        return None
    weights, v = pv.args
    sm = _single(producers, uses, weights)
    if sm is None or sm.op != "softmax" or not isinstance(v, Value):
        return None
    node = _single(producers, uses, sm.args[0])
    mask: torch.Tensor | None = None
    fill: tuple[torch.Tensor, float, bool] | None = None
    if node is not None and node.op in ("add", "select"):
        found = _mask_operand(b, node, producers)
        if found is None:
            return None
        scores, mask, fill = found
        node = _single(producers, uses, scores)
    scale = 1.0
    if node is not None and node.op in ("mul", "div") and len(node.args) == 2:
        c = edit.const(b, node.args[1], producers)
        if c is None or c.numel() != 1 or not c.is_floating_point():
            return None
        scale = float(c) if node.op == "mul" else 1.0 / float(c)
        node = _single(producers, uses, node.args[0])
    if node is None or node.op != "matmul" or node.attrs.get("transposeA") or len(node.args) != 2:
        return None
    q, k = node.args
    if not node.attrs.get("transposeB"):
        t = _single(producers, uses, k)
        if t is None or t.op != "transpose" or not isinstance(t.args[0], Value):
            return None
        axes = list(t.attrs.get("axes", []))
        n = len(axes)
        if n < 2 or axes != [*range(n - 2), n - 1, n - 2]:
            return None
        k = t.args[0]
    if not all(isinstance(x, Value) and x.dtype == torch.float32 for x in (q, k, v)):
        return None
    ks, vs = edit.static(k.shape), edit.static(v.shape)
    if ks is not None and mask is None and fill is None and _decode_step(b, q, k, v, ks, producers):
        fits = sm.attrs.get("axes") == [len(ks) - 1] and math.isfinite(scale)
        return (q, k, v, scale, None) if fits else None
    qs = edit.static(q.shape)
    if qs is None or ks is None or vs is None or not (len(qs) == len(ks) == len(vs)) or len(qs) not in (3, 4):
        return None
    (length, dim), (source, kdim), (vsource, vdim) = qs[-2:], ks[-2:], vs[-2:]
    if not (qs[:-2] == ks[:-2] == vs[:-2] and dim == kdim == vdim and source == vsource):
        return None  # flash SDPA needs equal head dims; broadcast batch axes are left alone
    if length * source > MAX_FLASH_AREA_SKIPPING or sm.attrs.get("axes") != [len(qs) - 1]:
        return None
    if not math.isfinite(scale):
        return None
    additive = None
    if mask is not None or fill is not None:
        additive = _additive(mask, fill, qs[:-2], length, source)
        if additive is None:
            return None
    limit = MAX_FLASH_AREA_SKIPPING if additive is not None and _skips_a_tile(additive) else MAX_FLASH_AREA
    if length * source > limit:
        return None
    return q, k, v, scale, additive


def _decode_step(
    b: NNEFBuilder, q: Value, k: Value, v: Value, ks: list[int], producers: dict[str, Assignment]
) -> bool:
    """A decoder step's attention over computed keys: q ``[..., S, D]`` with only S symbolic, k and
    v ``[..., source, D]`` static, equal batch axes, ``source >= MIN_DECODE_KEYS``, not weights."""
    if q.shape is None or len(q.shape) != len(ks) or len(ks) not in (3, 4) or v.shape is None:
        return False
    *batch, length, dim = q.shape
    if isinstance(length, int) or edit.static([*batch, dim]) is None or list(v.shape) != ks:
        return False
    if [*batch, dim] != [*ks[:-2], ks[-1]] or ks[-2] < MIN_DECODE_KEYS:
        return False
    return edit.const(b, k, producers) is None and edit.const(b, v, producers) is None


def _skips_a_tile(mask: torch.Tensor) -> bool:
    """Whether some 32×32 tile of the mask is wholly at the level tract's flash kernel skips."""
    length, source = mask.shape[-2:]
    return any(
        bool((mask[..., i : i + _TILE, j : j + _TILE] < _SKIP_BELOW).all())
        for i in range(0, length, _TILE)
        for j in range(0, source, _TILE)
    )


def _mask_operand(
    b: NNEFBuilder, node: Assignment, producers: dict[str, Assignment]
) -> tuple[Any, torch.Tensor | None, tuple[torch.Tensor, float, bool] | None] | None:
    """(scores, additive mask, masked_fill spec) of ``add(scores, M)`` / ``select(C, fill, scores)``."""
    if node.op == "add" and len(node.args) == 2:
        for scores, m in (node.args, node.args[::-1]):
            const = edit.const(b, m, producers)
            if isinstance(scores, Value) and edit.const(b, scores, producers) is None and const is not None:
                return (scores, const, None) if const.dtype == torch.float32 else None
        return None
    if node.op == "select" and len(node.args) == 3:
        cond = edit.const(b, node.args[0], producers)
        if cond is None or cond.dtype != torch.bool:
            return None
        _, first, second = node.args
        for keep_when_true, scores, fill in ((False, second, first), (True, first, second)):
            value = edit.const(b, fill, producers)
            if (
                isinstance(scores, Value)
                and edit.const(b, scores, producers) is None
                and value is not None
                and value.numel() == 1
                and value.is_floating_point()
                and float(value) <= _FILL_CEILING
            ):
                return scores, None, (cond, float(value), keep_when_true)
        return None
    return None


def _additive(
    mask: torch.Tensor | None,
    fill: tuple[torch.Tensor, float, bool] | None,
    batch: list[int],
    length: int,
    source: int,
) -> torch.Tensor | None:
    """The mask as a float32 ``[b|1, (h|1,) L, S]`` tensor for tract, or None when not equivalent."""
    rank = len(batch) + 2
    if fill is not None:
        cond, value, keep_when_true = fill
        masked = ~cond if keep_when_true else cond
        mask = torch.zeros(masked.shape, dtype=torch.float32).masked_fill(masked, value)
    assert mask is not None
    if mask.dim() > rank:
        return None
    mask = mask.reshape((1,) * (rank - mask.dim()) + tuple(mask.shape)).to(torch.float32)
    full = [*batch, length, source]
    if any(d not in (1, f) for d, f in zip(mask.shape, full, strict=True)):
        return None  # the add would broadcast the scores themselves
    if torch.isnan(mask).any() or (mask == math.inf).any():
        return None
    mask = mask.expand(*mask.shape[:-2], length, source)
    if (mask.amax(dim=-1) < _ROW_FLOOR).any():
        return None  # a row that attends nothing: tract's kernel and the chain disagree there
    return mask.clamp(min=torch.finfo(torch.float32).min).contiguous()
