"""Minimal failing examples found by the fuzzer (tests/test_fuzz.py), kept as regular tests.

Each one exported without error and then disagreed with PyTorch in tract (or tract could not run
it). The property is the fuzzer's: a front end either verifies the model in tract or refuses it
at export time with a typed error — never a CheckError, never a raw exception.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

import torchlower
from tests.conftest import export_and_check
from tests.fuzz_harness import tolerance
from tests.test_rules_math import Fn
from torchlower.core.comparison import compare
from torchlower.errors import CheckError, TorchlowerError
from torchlower.nnef.tract import run_in_tract

INF, NAN = float("inf"), float("nan")


def verified_or_refused(
    fn: Callable[..., object], args: tuple[torch.Tensor, ...], tmp: Path, frontend: str
) -> None:
    """Verified in tract per output (tolerance from that output's finite values: the default check
    takes one tolerance from all outputs, infinite as soon as one holds inf), or, off the jit
    front end only, a typed error at export time."""
    model = Fn(fn).eval()
    try:
        report = torchlower.export(model, args, tmp / "m.nnef.tgz", frontend=frontend, check=False)
    except CheckError:
        raise
    except TorchlowerError:
        if frontend == "jit":
            raise
        return
    with torch.no_grad():
        out = model(*args)
    want = [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
    got = run_in_tract(report.path, [a.numpy() for a in args])
    for k, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w.shape == g.shape, f"output {k}: tract shape {g.shape}, torch {w.shape}"
        err = compare([f"output {k}"], [w], [g], tolerance(w))[0]
        assert err.ok, f"output {k}: max |torch - tract| = {err.max_abs}\ntorch {w}\ntract {g}"


def test_zero_factor_keeps_nan_and_inf(tmp_path, frontend):
    """tract folds ``x * 0`` and ``0 / x`` to 0; torch gives NaN for inf/NaN (and 0 / 0)."""
    x = torch.tensor([0.0, -0.0, 1.0, NAN, -2.0, INF, -INF])
    verified_or_refused(
        lambda t: (0.0 / t, t * 0, 0 * t, torch.mul(t, 0.0), t.int() * 0.0), (x,), tmp_path, frontend
    )


def test_zero_numerator_div(tmp_path, frontend):
    x = torch.tensor([0.0, 1.0, NAN, -2.0, INF])
    verified_or_refused(lambda t: torch.div(0.0, t), (x,), tmp_path, frontend)


def test_negative_zero_factor(tmp_path, frontend):
    """``x * -0.0`` is -0 for positive x (rsqrt of it is -inf); the unfolded form lost the sign."""
    x = torch.tensor([2.0, -3.0, 0.5, INF])
    verified_or_refused(lambda t: (torch.rsqrt(t * -0.0), 1 / (-0.0 * t)), (x,), tmp_path, frontend)


def test_reshape_to_rank_0(tmp_path, frontend):
    """tract cannot read ``reshape(x, shape = [])``; roll of a 0-d tensor flattens and reshapes back."""
    args = (torch.tensor(1.5), torch.tensor([[2.0]]))
    verified_or_refused(
        lambda x, y: (torch.roll(x, -6), y.reshape(()), torch.roll(x > 0, 2)), args, tmp_path, frontend
    )


def test_split_into_one_chunk(tmp_path, frontend):
    """jit: ``prim::ListUnpack`` of a one-element list bound the list itself, not its element."""
    x = torch.randn(1, 1, 3, 5)
    verified_or_refused(
        lambda t: torch.any(torch.split(t, 1, 0)[0], dim=[-4, 3], keepdim=True), (x,), tmp_path, frontend
    )


def test_return_type_fields(tmp_path, frontend):
    """fx: ``torch.min(x, dim).values`` met a plain tuple from the rule (raw AttributeError)."""
    x = torch.randn(2, 4)
    fn = lambda t: (torch.min(t, -2).values, torch.max(t, 1).indices, torch.aminmax(t).max)  # noqa: E731
    verified_or_refused(fn, (x,), tmp_path, frontend)


def test_zero_factor_inside_rules(tmp_path, frontend):
    """fmod/remainder by 0.0 and std of one element multiply by a literal 0 that tract folded."""
    x, i, e = torch.tensor([1.0, -2.0, 0.0]), torch.tensor([3, -2, 0]), torch.randn(1, 3)
    fn = lambda t, n, u: (torch.fmod(n, 0.0), torch.remainder(t, 0.0), torch.std(u, 0), u % 0.0)  # noqa: E731
    verified_or_refused(fn, (x, i, e), tmp_path, frontend)


def test_identifier_starting_with_true(tmp_path, frontend):
    """fx names ``0.0 / x`` ``truediv``; tract's parser reads a leading ``true`` as a literal."""
    x = torch.tensor([0.5, -2.0, 4.0])
    verified_or_refused(lambda t: (1.5 / t) / (t + 1), (x,), tmp_path, frontend)


def test_int_scalar_ops_keep_rank_0(tmp_path, frontend):
    """Integer scalars are [1]-shaped constants; on a 0-d tensor the result became [1]."""
    fn = lambda i: (lambda v: (torch.clamp(torch.fmod(v, 2), min=0), v * 2, v == 3, v % 3, v // 2))(i.max())  # noqa: E731
    verified_or_refused(fn, (torch.tensor([3, -2, 0]),), tmp_path, frontend)


def test_linear_of_a_vector(tmp_path, frontend):
    """F.linear on a 1-D input: tract's matmul needs equal ranks (export front end)."""
    w = torch.randn(3, 4)
    verified_or_refused(lambda x: torch.nn.functional.linear(x, w), (torch.randn(4),), tmp_path, frontend)


def test_zero_remainder_keeps_the_dividend_sign(tmp_path, frontend):
    """fmod/remainder equal to 0 are -0.0 for a negative dividend; 1 / it is -inf in torch."""
    x, y = torch.tensor([-2.0, 2.0, -0.5, 3.0, 0.0, -4.0]), torch.tensor([1.0, -1.0, 0.25, 1.5, 2.0, -2.0])
    fn = lambda a, c: (1 / (a % c), 1 / torch.fmod(a, c), 1 / torch.remainder(a, 1.0), 1 / (-2.0 % c))  # noqa: E731
    verified_or_refused(fn, (x, y), tmp_path, frontend)


def test_strided_slice_of_one_element(tmp_path, frontend):
    """tract's declutter fails ("Invalid axis") on a step-3 slice of an axis added by unsqueeze."""
    x = torch.rand(3, 1, 4, 3) > 0.5
    verified_or_refused(
        lambda t: torch.any(t, dim=[0, 1, 2, 3]).unsqueeze(0)[-3:2:3], (x,), tmp_path, frontend
    )


def test_fmod_remainder_with_an_inexact_divisor(tmp_path, frontend):
    """x / 0.1 rounded in f32 can reach the next integer: fmod(-0.5, 0.1) came out ~0, not -0.1."""
    x = torch.arange(-20, 20).float() / 2
    fn = lambda t: (torch.fmod(t, 0.1), torch.fmod(-t, 0.3), t % 0.1, torch.remainder(t, -0.3))  # noqa: E731
    verified_or_refused(fn, (x,), tmp_path, frontend)


def test_fmod_remainder_of_exact_multiples(tmp_path, frontend):
    """tract divides as x * recip(y), in float64 too: x / x came out 0.999…, so fmod(x, x) and
    x % x were x, not 0 (a fuzz case, mod(x, max_pool(x)), was off by 7.65)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, generator=g) * 5
    y = torch.cat([x[:1000], -x[1000:2000], x[2000:] / 3])
    fn = lambda a, c: (torch.fmod(a, c), a % c, torch.fmod(-3.0 * a, c), torch.remainder(3.0, c))  # noqa: E731
    verified_or_refused(fn, (x, y), tmp_path, frontend)


def test_fmod_remainder_of_a_smaller_dividend(tmp_path, frontend):
    """|x| < |y|: fmod(x, ±inf) and fmod(x, 1e30) are x, -7.5 // 1e30 is -1, -1 % inf is inf;
    x - q·y is not exact in float64 there and moved q (-7.5 // 1e30 gave 0, fmod(x, inf) NaN)."""
    x = torch.tensor([-7.5, 7.5, -0.0, 0.0, 3.0, -3.0, 2.0, -2.0])
    y = torch.tensor([INF, -INF, INF, -INF, 1e30, -1e30, -1e30, 1e30])
    signs = torch.tensor([INF, -INF, INF, -INF, INF, -INF, -INF, INF])
    fn = lambda a, c, s: (torch.fmod(a, c), torch.floor_divide(a, c), a % s, torch.remainder(1.5, s))  # noqa: E731
    verified_or_refused(fn, (x, y, signs), tmp_path, frontend)


def test_atan2_of_negative_zero(tmp_path, frontend):
    """atan2(-0.0, x < 0) is -pi in torch; the rule turned by +pi for every y >= 0."""
    y = torch.tensor([-0.0, 0.0, -0.0, 0.0, -1.0, 1.0])
    x = torch.tensor([-2.0, -2.0, 3.0, 3.0, -1.0, -1.0])
    verified_or_refused(lambda a, c: torch.atan2(a, c), (y, x), tmp_path, frontend)


def test_atan2_at_the_origin(tmp_path, frontend):
    """atan2(±0, -0) is ±pi and atan2(±0, +0) is ±0; the rule gave 0 for all four.
    ``1 / atan2`` makes the sign of a zero result visible to the comparison."""
    y = torch.tensor([0.0, -0.0, 0.0, -0.0])
    x = torch.tensor([-0.0, -0.0, 0.0, 0.0])
    verified_or_refused(lambda a, c: (torch.atan2(a, c), 1 / torch.atan2(a, c)), (y, x), tmp_path, frontend)


def test_division_by_signed_zero_literals(tmp_path, frontend):
    """tract merges equal constants and ``-0.0 == 0.0``: ``x / -0.0`` next to ``x / 0.0`` took one
    sign for both. Division by a constant zero is now ``x * ±inf`` (floor_divide too)."""
    x = torch.tensor([0.0, -0.0, 1.0, -2.0, NAN, INF, -INF])
    verified_or_refused(
        lambda t: (t / -0.0, t / 0.0, torch.floor_divide(t, 0.0), torch.floor_divide(t, -0.0)),
        (x,),
        tmp_path,
        frontend,
    )
    n = torch.tensor([0, 3, -2])
    verified_or_refused(
        lambda t: (t.abs() / -0.0, t / 0.0, torch.floor_divide(t, 0.0)), (n,), tmp_path, frontend
    )


def test_strided_slice_after_softmax(tmp_path, frontend):
    """tract pulls a strided slice up through softmax as if it were elementwise:
    ``softmax(x)[::3]`` came out as ``softmax(x[::3])``."""
    x = torch.randn(2, 7)
    verified_or_refused(
        lambda t: (
            torch.softmax(t, -1)[:, ::3],
            (torch.log_softmax(t, 1) * 2)[:, 1::2],
            torch.softmax(t, 0)[::2, 1:6:2],
        ),
        (x,),
        tmp_path,
        frontend,
    )


def test_three_equal_nodes(tmp_path, frontend):
    """tract's merging of three equal nodes, the middle one consumed, left a ``Dummy`` op behind."""
    x = torch.tensor([0.3, -1.0])
    verified_or_refused(
        lambda t: (
            torch.exp(t),
            torch.exp(torch.log(torch.exp(t))),
            torch.exp(t),
            torch.sin(t + 1) + (t + 1),
        ),
        (x,),
        tmp_path,
        frontend,
    )


def test_integer_product_of_a_tensor_with_itself(tmp_path, frontend):
    """tract rewrites ``mul(x, x)`` to ``square``, which has no integer kernel ("Square does not
    support I64"); integer self-products are written as ``x * (x + 1) - x``."""
    args = (torch.tensor([[1, -2, 3]]), torch.tensor(-7))
    verified_or_refused(
        lambda t, s: (t * t, torch.pow(t, 2), torch.square(t), s * s), args, tmp_path, frontend
    )


def test_strided_conv_over_an_unsqueezed_axis(tmp_path, frontend):
    """A stride on an axis with one window position: tract split it into a ``Downsample`` that it
    then failed to move over the ``unsqueeze`` ("Invalid axis" at load). The stride is moot there."""
    x = torch.randn(1, 2, 5)
    verified_or_refused(
        lambda t: (
            torch.nn.functional.conv2d(t.unsqueeze(2), torch.ones(2, 2, 1, 1), stride=2),
            torch.nn.functional.conv2d(t.unsqueeze(3), torch.ones(3, 2, 1, 1), stride=(2, 3)),
        ),
        (x,),
        tmp_path,
        frontend,
    )


def test_log1p_expm1_logsigmoid_keep_small_values(tmp_path, frontend):
    """``log(1 + x)`` / ``exp(x) - 1`` lose a small x to rounding (log1p(1e-8) was 0, so its
    reciprocal inf); log_sigmoid's tail went through the same log. Found as ``-2.25 /
    logsigmoid(2 ** v)`` off by 1.19."""
    x = torch.tensor(
        [0.0, -0.0, 1e-8, -1e-8, 1e-4, 0.5, -0.5, -1.0, -2.0, 3.0, 88.0, 100.0, -100.0, INF, -INF, NAN,
         1e30, 3e38, -0.99999994, 5.960464477539063e-08, -2.9802322387695312e-08]
    )  # fmt: skip
    verified_or_refused(
        lambda t: (
            torch.log1p(t),
            torch.expm1(t),
            torch.nn.functional.logsigmoid(t),
            1 / torch.log1p(t),
            1 / torch.expm1(t),
            -2.25 / torch.nn.functional.logsigmoid(t),
        ),
        (x,),
        tmp_path,
        frontend,
    )


def test_rounded_division_is_exact(tmp_path, frontend):
    """tract divides floats as ``x * recip(y)``: ``floor(x / |x|)`` came out 0 for 162 of 2000
    random x. Found as ``acosh(2 ** sin(x // |x|))`` off by 1.19; also pow(-0., -0.5) = -inf."""
    torch.manual_seed(0)
    x = torch.cat(
        [torch.randn(200) * 3, torch.tensor([0.0, -0.0, 7.0, -7.0, 0.5, INF, -INF, NAN, -1.0, 1.0])]
    )
    y = torch.cat([torch.randn(200) * 3, torch.tensor([1.0, 1.0, 3.5, 3.5, -0.25, 2.0, 2.0, 1.0, INF, -INF])])
    verified_or_refused(
        lambda a, c: (
            torch.div(a, a.abs(), rounding_mode="floor"),
            torch.div(a, c, rounding_mode="floor"),
            torch.div(a, c, rounding_mode="trunc"),
            torch.floor_divide(a, c),
            a // 0.1,
            torch.pow(a, -0.5),
        ),
        (x, y),
        tmp_path,
        frontend,
    )


def test_quotient_read_by_a_discontinuous_op(tmp_path, frontend):
    """``floor(x / |x|)`` written by hand, ``sign``, ``round`` and casts of quotients: tract's
    ``x * recip(y)`` is 1 ulp off often enough to flip them; such quotients run in float64."""
    torch.manual_seed(0)
    x, y = torch.randn(500) * 3, torch.randn(500) * 3
    verified_or_refused(
        lambda a, c: (
            torch.floor(a / a.abs()),
            torch.ceil(a / c),
            torch.round(a / a.abs()),
            (a / a.abs()).long(),
            torch.sign(a / a.abs() - 1),
            torch.round(a, decimals=-1),
        ),
        (x, y),
        tmp_path,
        frontend,
    )


def test_rounded_division_of_scalars_and_broadcasts(tmp_path, frontend):
    """The exact floor division on rank-0 and broadcast operands, with infinities: a rank-0 float64
    constant had been printed as a float32 literal, which tract's ``select`` refused."""
    cases = [
        (
            (torch.tensor(3.0), torch.tensor(0.5)),
            lambda a, c: (a // c, torch.div(a, c, rounding_mode="trunc")),
        ),
        ((torch.tensor(INF), torch.tensor(-1.0)), lambda a, c: (a // c, c // a)),
        ((torch.tensor([[3, -4, 5]]), torch.tensor([0.5, -0.7, INF])), lambda a, c: (a // c, a // 0.3)),
        ((torch.tensor([[INF], [-2.0]]), torch.tensor([INF, 3.0, 0.0])), lambda a, c: a // c),
    ]
    for args, fn in cases:
        verified_or_refused(fn, args, tmp_path, frontend)


def test_rounded_division_with_a_scalar_dividend(tmp_path, frontend):
    """``2.442 // x`` and ``-0.0 // x``: FX passes the scalar as a constant, and -0.0 is written as
    a float32 tensor; both met float64 operands in ``select`` and tract refused the graph."""
    x = torch.tensor([3.0, -0.5, 0.0, INF, -2.0])
    verified_or_refused(
        lambda t: (2.442 // t, -0.0 // t, torch.floor_divide(INF, t)), (x,), tmp_path, frontend
    )


def test_matmul_by_a_constant_after_a_reshape(tmp_path, frontend):
    """tract folded the reshape into the matmul and applied it to the constant's broadcast axis
    ("Incompatible reshape for shape [1, 1, 3]"); found as ``interpolate(x.reshape(30, 3, 1))``."""
    w, m = torch.randn(4, 3), torch.randn(3, 5)
    F = torch.nn.functional
    verified_or_refused(
        lambda t: (
            F.linear(t.reshape(30, 1, 3), w),
            F.linear(t.reshape(30, 1, 3), w, torch.ones(4)),
            t.reshape(30, 1, 3) @ m,
            F.interpolate(t.reshape(30, 3, 1), scale_factor=3.0, mode="linear", align_corners=False),
        ),
        (torch.randn(3, 2, 5, 3),),
        tmp_path,
        frontend,
    )


def test_matmul_by_a_constant_after_a_reshape_of_inner_axes(tmp_path, frontend):
    """The guard above is scoped to reshapes of the batch axes (it costs 1-4 % on attention's
    output projection): reshapes that merge heads or rows, or split the leading axis, keep the
    plain matmul and must still load and match."""
    w, wide = torch.randn(4, 12), torch.randn(3, 60)
    F = torch.nn.functional
    verified_or_refused(
        lambda t: (
            F.linear(t.reshape(2, 5, 12), w),
            F.linear(t.reshape(2, 5, 12), w, torch.ones(4)),
            F.linear(t.reshape(2, 1, 60), wide),
            F.linear(t.transpose(1, 2).reshape(2, 3, 20)[..., :12], w),
            t.reshape(2, 5, 12) @ w.T,
        ),
        (torch.randn(2, 5, 3, 4),),
        tmp_path,
        frontend,
    )
    model = Fn(lambda t: F.linear(t.reshape(2, 5, 12), w)).eval()
    report = torchlower.export(model, torch.randn(2, 5, 3, 4), tmp_path / "h.nnef.tar", frontend=frontend)
    assert report.op_histogram["reshape"] == 1  # no flattening around the matmul


def test_matmul_by_a_constant_after_an_expand(tmp_path, frontend):
    """tract's einsum declutter pulled the broadcast of ``expand`` through a matmul by a constant
    and got the output's leading size wrong ("Trying to substitute a 2,5,4,3,3 by 1,5,4,3,3")."""
    c = torch.randn(4, 3)
    verified_or_refused(
        lambda t: (
            t.expand(2, -1, -1, -1, -1) @ c,
            torch.prod(torch.round(t).expand(2, -1, -1, -1, -1) @ c, -4),
        ),
        (torch.randn(5, 4, 3, 4),),
        tmp_path,
        frontend,
    )


def test_tanh_gelu_in_the_saturated_tail(tmp_path, frontend):
    """tract's fused tanh-gelu drifts far below zero (-2980 at -1e10; torch: -0.0, since 1 + tanh
    is exactly 0 there). Found as ``1 / gelu(sinh(x), approximate='tanh')``."""
    F = torch.nn.functional
    x = torch.tensor([-1e10, -1e13, -20.0, -10.5, -3.0, -1.0, 0.0, 0.5, 3.0, 1e10, INF, -INF, NAN])
    verified_or_refused(
        lambda t: (F.gelu(t, approximate="tanh"), 1 / F.gelu(t, approximate="tanh")), (x,), tmp_path, frontend
    )


def test_strided_slice_of_a_split_axis(tmp_path, frontend):
    """LeViT's subsample ``x.view(B, 4, 4, C)[:, ::2, ::2]``: tract's declutter pulled the strided
    slice over the axis-splitting reshape and failed to load ("Pulling Downsample over Reshape:
    Invalid axis"); the guard writes it as gathers."""

    def subsample(t: torch.Tensor) -> torch.Tensor:
        b, _, c = t.shape
        return torch.relu(t).view(b, 4, 4, c)[:, ::2, 1::2].reshape(b, -1, c) * 2

    export_and_check(Fn(subsample), (torch.randn(2, 16, 8),), tmp_path, frontend)


def test_strided_slice_of_merged_axes(tmp_path, frontend):
    """``x.flatten()[-3::2]`` (value-dependence fuzz, seed 1): tract's declutter pulled the strided
    slice over the axis-merging reshape and failed to load ("Pulling Downsample over Reshape:
    Invalid axis"); the guard writes it as gathers, for floats and integers."""
    for x in (torch.randn(4, 2), torch.arange(8).reshape(4, 2)):
        export_and_check(Fn(lambda t: t.flatten()[-3::2].flip(0)), (x,), tmp_path, frontend)
        export_and_check(Fn(lambda t: t.flatten(1)[:, ::2] * 2), (x.reshape(2, 2, 2),), tmp_path, frontend)


class LogSoftplus(nn.Module):
    def forward(self, x):
        return torch.log(F.softplus(x)), F.softplus(x, beta=2.0)


def test_softplus_keeps_small_values(tmp_path):
    """tract's softplus is log(exp(x) + 1): 0 below x ≈ -17, so log(softplus(-30)) was -inf
    (found by the value-dependence fuzz as atan2(log(softplus(x)), y)); torch uses log1p."""
    x = torch.tensor([[-30.0, -17.0, -5.0, 0.0, 3.0, 19.0, 25.0]])
    export_and_check(LogSoftplus(), x, tmp_path, "jit")


def test_extrema_of_infinite_rows(tmp_path, frontend):
    """tract's max/min reductions (and the max_pool form of a last-axis max) start from the type's
    finite extreme: a row of only -inf gave -3.4028235e38, not -inf. ``guards.wide_extrema`` runs
    them one type wider; rows holding ``finfo.min`` (HF's mask fill) keep their finite value."""
    low = torch.finfo(torch.float32).min
    x = torch.randn(3, 4, 5)
    x[0, 1] = -INF
    x[1, :, 2] = -INF
    x[2, 2] = INF
    x[2, 3] = torch.tensor([low, -INF, low, -INF, -INF])
    verified_or_refused(
        lambda t: (t.amax(-1), t.amax((1, 2)), t.amin(-1), -(-t).amin(1), t.max(-1).values,
                   torch.max(t, 1).values, torch.logsumexp(t, -1), t.amax(-1, keepdim=True) * 2),
        (x,), tmp_path, frontend,
    )  # fmt: skip


def test_extrema_of_infinite_rows_in_f16(tmp_path):
    """The same in a half-precision graph: tract's f16 max starts at -65504."""
    x = torch.randn(2, 3, 8)
    x[0, 1] = -INF
    x[1, :, 3] = INF
    report = torchlower.export(Fn(lambda t: (t.amax(-1), t.amin(1))).eval(), (x,), tmp_path / "h.nnef.tgz",
                               precision="f16", check=False)  # fmt: skip
    half = x.half()
    got = run_in_tract(report.path, [x.numpy()])  # the graph takes f32 and computes in f16
    for w, g in zip([half.amax(-1).numpy(), half.amin(1).numpy()], got, strict=True):
        np.testing.assert_array_equal(g.astype(np.float16), w)  # a max of f16 values is one of them
