"""Fourier transforms: torch.fft.fft/ifft/rfft/irfft/fft2/fftn/ifftn, their ATen primitives
(_fft_r2c/_fft_c2c/_fft_c2r) and torch.stft, onto ``tract_core_fft`` / ``tract_core_stft``.

tract's transforms read and write complex values as a trailing ``[re, im]`` axis
(``complex_parts.py``) and are unnormalized in both directions (rustfft), so torch's ``norm``
becomes one constant scale. ``n`` pads with zeros or truncates first; ``rfft`` keeps the first
n//2 + 1 bins; ``irfft`` rebuilds the Hermitian spectrum (mirrored conjugates) and keeps the
real part of the inverse, which ignores the imaginary parts of the DC and Nyquist bins as
torch's C2R transform does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from torchlower.core.values import Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder
from torchlower.rules.complex_parts import (
    complex_aware,
    conj_physical,
    is_complex,
    logical,
    part,
    physical,
    scale,
    to_complex,
)
from torchlower.rules.creation import filled
from torchlower.rules.indexing import scatter_elements
from torchlower.rules.layout import concat, dims_of, gather_axis, slice_dim, transpose
from torchlower.rules.overlap_add import dynamic_istft_tail

_NORMS = {None: 0, "backward": 0, "ortho": 1, "forward": 2}


def _norm_code(norm: str | None, forward: bool) -> int:
    """torch's ``norm`` name as the ATen normalization code: 0 none, 1 1/sqrt(n), 2 1/n."""
    if norm not in _NORMS:
        raise LoweringError(f"fft: norm must be 'backward', 'ortho' or 'forward', got {norm!r}")
    code = _NORMS[norm]
    return code if forward or code == 1 else 2 - code  # the inverse divides by n by default


def _static(p: Value, axis: int, what: str) -> int:
    n = dims_of(p)[axis]
    if not isinstance(n, int):
        raise LoweringError(f"{what}: the transformed axis must be static, got {n!r}")
    return n


def _fit(b: Builder, p: Value, axis: int, n: int) -> Value:
    """Zero-pad or truncate physical ``p`` to length ``n`` on ``axis``."""
    have = _static(p, axis, "fft")
    if n == have:
        return p
    if n < have:
        return slice_dim(b, p, axis, 0, n)
    pads = [(0, 0)] * p.rank
    pads[axis] = (0, n - have)
    shape = list(dims_of(p))
    shape[axis] = n
    return b.call(
        "pad", [p], {"padding": pads, "border": "constant", "value": 0.0}, dtype=p.dtype, shape=tuple(shape)
    )


def _fft(b: Builder, p: Value, axis: int, inverse: bool, code: int) -> Value:
    """One transform of physical ``p`` along ``axis`` with normalization ``code``."""
    n = _static(p, axis, "fft")
    y = b.call("tract_core_fft", [p], {"axis": axis, "inverse": inverse}, dtype=p.dtype, shape=p.shape)
    return scale(b, y, {0: 1.0, 1: 1 / math.sqrt(n), 2: 1 / n}[code])


def _real_bins(b: Builder, p: Value, axis: int) -> Value:
    """The spectrum of a real signal with the DC (and even-length Nyquist) bins exactly real.

    Those bins are real in exact arithmetic and torch's real-input transforms write them so;
    tract's complex FFT leaves ±0 or a rounding residue there, which flips ``angle`` by 2π.
    """
    n = _static(p, axis, "fft")
    shape = [1] * p.rank
    shape[axis], shape[-1] = n, 2
    mask = torch.zeros(shape, dtype=torch.bool)
    bins = [0, n // 2] if n % 2 == 0 else [0]
    index = [slice(None)] * p.rank
    for k in bins:
        index[axis], index[-1] = k, 1
        mask[tuple(index)] = True
    return b.call("select", [constant(mask), 0.0, p], dtype=p.dtype, shape=p.shape)


def _c2c(
    b: Builder, x: Value, dims: Sequence[int], sizes: Sequence[int | None], norm: str | None, forward: bool
) -> Value:
    p = to_complex(b, x)
    rank = p.rank - 1
    for k, (d, n) in enumerate(zip(dims, sizes, strict=True)):
        axis = normalize_dim(d, rank)
        if n is not None:
            p = _fit(b, p, axis, int(n))
        p = _fft(b, p, axis, not forward, _norm_code(norm, forward))
        if k == 0 and forward and not is_complex(x):
            p = _real_bins(b, p, axis)
    return logical(p)


def _real_input(x: Value, what: str) -> None:
    if is_complex(x):
        raise LoweringError(f"{what}: expects a real input (torch refuses complex ones)")


@rule("aten::fft_fft")
@complex_aware
def fft_fft(b: Builder, x: Value, n: int | None, dim: int, norm: str | None) -> Value:
    """fft_fft(Tensor self, SymInt? n=None, int dim=-1, str? norm=None) -> Tensor"""
    return _c2c(b, x, [dim], [n], norm, True)


@rule("aten::fft_ifft")
@complex_aware
def fft_ifft(b: Builder, x: Value, n: int | None, dim: int, norm: str | None) -> Value:
    """fft_ifft(Tensor self, SymInt? n=None, int dim=-1, str? norm=None) -> Tensor"""
    return _c2c(b, x, [dim], [n], norm, False)


def _dims_sizes(
    x: Value, s: Sequence[int] | None, dim: Sequence[int] | None, default: int | None
) -> tuple[list[int], list[int | None]]:
    rank = x.rank
    if dim is None:
        dims = list(range(rank - len(s), rank)) if s is not None else list(range(rank))
        if default is not None and s is None:
            dims = dims[-default:]
    else:
        dims = [normalize_dim(d, rank) for d in dim]
    sizes: list[int | None] = list(s) if s is not None else [None] * len(dims)
    if len(sizes) != len(dims):
        raise LoweringError(f"fftn: s {list(s or [])} and dim {list(dim or [])} differ in length")
    return dims, sizes


@rule("aten::fft_fftn", "aten::fft_fft2")
@complex_aware
def fft_fftn(
    b: Builder, x: Value, s: Sequence[int] | None, dim: Sequence[int] | None, norm: str | None
) -> Value:
    """fft_fftn(Tensor self, SymInt[1]? s=None, int[1]? dim=None, str? norm=None) -> Tensor (also fft2)"""
    dims, sizes = _dims_sizes(x, s, dim, None)
    return _c2c(b, x, dims, sizes, norm, True)


@rule("aten::fft_ifftn", "aten::fft_ifft2")
@complex_aware
def fft_ifftn(
    b: Builder, x: Value, s: Sequence[int] | None, dim: Sequence[int] | None, norm: str | None
) -> Value:
    """fft_ifftn(Tensor self, SymInt[1]? s=None, int[1]? dim=None, str? norm=None) -> Tensor (also ifft2)"""
    dims, sizes = _dims_sizes(x, s, dim, None)
    return _c2c(b, x, dims, sizes, norm, False)


def _onesided(b: Builder, p: Value, axis: int) -> Value:
    n = _static(p, axis, "rfft")
    return slice_dim(b, p, axis, 0, n // 2 + 1)


@rule("aten::fft_rfft")
@complex_aware
def fft_rfft(b: Builder, x: Value, n: int | None, dim: int, norm: str | None) -> Value:
    """fft_rfft(Tensor self, SymInt? n=None, int dim=-1, str? norm=None) -> Tensor"""
    _real_input(x, "rfft")
    full = physical(_c2c(b, x, [dim], [n], norm, True))
    return logical(_onesided(b, full, normalize_dim(dim, x.rank)))


def _hermitian(b: Builder, p: Value, axis: int, n: int) -> Value:
    """The full length-``n`` spectrum from its first n//2 + 1 bins (physical ``p``)."""
    half = _fit(b, p, axis, n // 2 + 1)
    mirrored = n - n // 2 - 1  # bins n//2+1 .. n-1 are conj(X[n-k]) for k = n//2+1 .. n-1
    if mirrored == 0:
        return half
    index = constant(torch.arange(mirrored, 0, -1, dtype=torch.int64))  # X[m], X[m-1], …, X[1]
    tail = conj_physical(b, gather_axis(b, half, index, axis))
    return concat(b, [half, tail], axis)


@rule("aten::fft_irfft")
@complex_aware
def fft_irfft(b: Builder, x: Value, n: int | None, dim: int, norm: str | None) -> Value:
    """fft_irfft(Tensor self, SymInt? n=None, int dim=-1, str? norm=None) -> Tensor"""
    p = to_complex(b, x)
    axis = normalize_dim(dim, p.rank - 1)
    length = int(n) if n is not None else 2 * (_static(p, axis, "irfft") - 1)
    if length < 1:
        raise LoweringError(f"irfft: output length {length} is not positive")
    full = _fft(b, _hermitian(b, p, axis, length), axis, True, _norm_code(norm, False))
    return part(b, full, 0)


# ---- the ATen primitives torch.export decomposes to ------------------------------------------
def _code_scale(code: int, n: int) -> float:
    return {0: 1.0, 1: 1 / math.sqrt(n), 2: 1 / n}[int(code)]


@rule("aten::_fft_c2c")
@complex_aware
def fft_c2c(b: Builder, x: Value, dim: Sequence[int], normalization: int, forward: bool) -> Value:
    """_fft_c2c(Tensor self, SymInt[] dim, int normalization, bool forward) -> Tensor"""
    p = to_complex(b, x)
    for d in dim:
        p = _fft(b, p, normalize_dim(d, p.rank - 1), not forward, int(normalization))
    return logical(p)


@rule("aten::_fft_r2c")
@complex_aware
def fft_r2c(b: Builder, x: Value, dim: Sequence[int], normalization: int, onesided: bool) -> Value:
    """_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor"""
    p = to_complex(b, x)
    dims = [normalize_dim(d, x.rank) for d in dim]
    for k, axis in enumerate(reversed(dims)):  # the last dim is the real-input one
        p = _fft(b, p, axis, False, int(normalization))
        if k == 0:
            p = _real_bins(b, p, axis)
    return logical(_onesided(b, p, dims[-1]) if onesided else p)


@rule("aten::_fft_c2r")
@complex_aware
def fft_c2r(b: Builder, x: Value, dim: Sequence[int], normalization: int, last_dim_size: int) -> Value:
    """_fft_c2r(Tensor self, int[] dim, int normalization, SymInt last_dim_size) -> Tensor"""
    p = to_complex(b, x)
    dims = [normalize_dim(d, p.rank - 1) for d in dim]
    for axis in dims[:-1]:
        p = _fft(b, p, axis, True, int(normalization))
    last = dims[-1]
    p = _fft(b, _hermitian(b, p, last, int(last_dim_size)), last, True, int(normalization))
    return part(b, p, 0)


# ---- short-time transform --------------------------------------------------------------------
@rule("aten::stft.center")
@complex_aware
def stft_center(
    b: Builder, x: Value, n_fft: int, hop_length: int | None, win_length: int | None, window: Value | None,
    center: bool, pad_mode: str, normalized: bool, onesided: bool | None, return_complex: bool | None,
    align_to_window: bool | None = None,
) -> Value:  # fmt: skip
    """stft.center(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None,
    bool center=True, str pad_mode="reflect", bool normalized=False, bool? onesided=None,
    bool? return_complex=None, bool? align_to_window=None) -> Tensor"""
    if center:
        from torchlower.rules.conv import pad

        if is_complex(x):
            raise LoweringError("stft: center=True pads a real signal; got a complex one")
        half = int(n_fft) // 2
        x = pad(b, x, [half, half], pad_mode, None)
    return stft(
        b, x, n_fft, hop_length, win_length, window, normalized, onesided, return_complex, align_to_window
    )


@rule("aten::stft")
@complex_aware
def stft(
    b: Builder, x: Value, n_fft: int, hop_length: int | None, win_length: int | None, window: Value | None,
    normalized: bool, onesided: bool | None, return_complex: bool | None, align_to_window: bool | None = None,
) -> Value:  # fmt: skip
    """stft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None,
    bool normalized=False, bool? onesided=None, bool? return_complex=None,
    bool? align_to_window=None) -> Tensor

    Centering (reflect padding) arrives as its own ``pad`` op before this one (jit, export) or
    through ``stft.center``. Frames of
    ``n_fft`` every ``hop_length`` on the last axis, the window centered in the frame (as torch
    pads it), one FFT each (``tract_core_stft``, which also takes a dynamic time axis);
    the result is torch's (…, freq, frames).
    """
    hop = int(hop_length) if hop_length is not None else int(n_fft) // 4
    win = int(win_length) if win_length is not None else int(n_fft)
    if window is not None and not window.is_const:
        raise LoweringError("stft: the window must be a constant tensor (a buffer or torch.*_window)")
    if window is not None and window.const.is_complex():
        raise LoweringError("stft: a complex window is not supported")
    if align_to_window:
        raise LoweringError("stft: align_to_window=True is not supported")
    if return_complex is False:
        raise LoweringError("stft: return_complex=False is deprecated in torch; use return_complex=True")
    w = window.const.to(torch.float32) if window is not None else torch.ones(win)
    if w.numel() != win or win > n_fft:
        raise LoweringError(f"stft: window of {w.numel()} for win_length {win} and n_fft {n_fft}")
    p = to_complex(b, x)
    axis = p.rank - 2  # time, before [re, im]
    time = dims_of(p)[axis]
    frames = (time - int(n_fft)) // hop + 1
    shape = (*dims_of(p)[:axis], frames, int(n_fft), 2)
    attrs = {"axis": axis, "frame": int(n_fft), "stride": hop, "window": b.tensor(constant(w.contiguous()))}
    y = b.call("tract_core_stft", [p], attrs, dtype=p.dtype, shape=shape)
    complex_input = is_complex(x)
    if not complex_input:
        y = _real_bins(b, y, axis + 1)
    if onesided is None or onesided:
        if complex_input and onesided:
            raise LoweringError("stft: onesided=True needs a real input")
        if not complex_input:
            y = slice_dim(b, y, axis + 1, 0, int(n_fft) // 2 + 1)
    if normalized:
        y = scale(b, y, 1 / math.sqrt(int(n_fft)))
    perm = [*range(axis), axis + 1, axis, axis + 2]  # (…, frames, freq, 2) → (…, freq, frames, 2)
    return logical(transpose(b, y, perm))


@rule("aten::istft")
@complex_aware
def istft(
    b: Builder, x: Value, n_fft: int, hop_length: int | None, win_length: int | None, window: Value | None,
    center: bool, normalized: bool, onesided: bool | None, length: int | None, return_complex: bool,
) -> Value:  # fmt: skip
    """istft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None,
    bool center=True, bool normalized=False, bool? onesided=None, int? length=None,
    bool return_complex=False) -> Tensor

    Inverse transform of every frame (``irfft`` over the frequency axis), the window applied,
    overlap-added with one scatter-add of constant positions and divided by the summed squared
    window, as torch does; then ``center`` trimming and ``length``. A dynamic frame count is
    overlap-added in constant-size pieces (``overlap_add.py``; hop_length must divide n_fft).
    """
    if return_complex or not is_complex(x):
        raise LoweringError("istft: expects a complex spectrum and return_complex=False")
    n, hop = int(n_fft), int(hop_length) if hop_length is not None else int(n_fft) // 4
    win = int(win_length) if win_length is not None else n
    if window is not None and not window.is_const:
        raise LoweringError("istft: the window must be a constant tensor")
    w = window.const.to(torch.float64) if window is not None else torch.ones(win, dtype=torch.float64)
    left = (n - win) // 2
    w = torch.nn.functional.pad(w, (left, n - win - left))
    p = physical(x)
    freq_axis, frame_axis = p.rank - 3, p.rank - 2
    frames = dims_of(p)[frame_axis]
    if onesided is None or onesided:
        full = _hermitian(b, p, freq_axis, n)
    else:
        full = p
    signal = part(b, _fft(b, full, freq_axis, True, 2), 0)  # (…, n_fft, frames), ifft's 1/n
    if normalized:
        signal = scale(b, signal, math.sqrt(n))
    lead = list(dims_of(signal)[:-2])
    weighted = b.call("mul", [signal, constant(w.to(torch.float32).reshape([1] * len(lead) + [n, 1]))],
                      dtype=signal.dtype, shape=signal.shape)  # fmt: skip
    if not isinstance(frames, int):  # a dynamic time axis: overlap-add of constant-size pieces
        return dynamic_istft_tail(b, weighted, w, hop, center, length)
    total = n + hop * (frames - 1)
    positions = (torch.arange(n)[:, None] + hop * torch.arange(frames)[None, :]).reshape(1, -1)
    flat = b.call("reshape", [weighted], {"shape": [*lead, n * frames]}, dtype=signal.dtype,
                  shape=(*lead, n * frames))  # fmt: skip
    plane = filled(b, 0, [*lead, total], signal.dtype)
    index = constant(positions.reshape([1] * len(lead) + [-1]).expand(*lead, -1).contiguous())
    y = scatter_elements(b, plane, len(lead), index, flat, "add")
    envelope = torch.zeros(total, dtype=torch.float64)
    for t in range(frames):
        envelope[t * hop : t * hop + n] += w**2
    start = n // 2 if center else 0
    end = total - n // 2 if center else total
    if length is not None:
        end = start + int(length)
    if end > total:
        raise LoweringError(f"istft: length {length} exceeds the {total - start} samples the frames hold")
    if bool((envelope[start:end].abs() < 1e-11).any()):
        raise LoweringError("istft: the window overlap-add is zero somewhere (torch fails there too)")
    y = slice_dim(b, y, len(lead), start, end)
    inverse = constant((1.0 / envelope[start:end]).to(torch.float32).reshape([1] * len(lead) + [-1]))
    return b.call("mul", [y, inverse], dtype=y.dtype, shape=y.shape)
