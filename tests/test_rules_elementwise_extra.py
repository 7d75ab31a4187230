"""Extra pointwise rules (torchlower/rules/elementwise_extra.py): export, run in tract, compare with torch."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import Fn, export_and_check


def _any(shape=(2, 3, 4, 5)) -> torch.Tensor:
    return torch.randn(*shape) * 3


def _pos(shape=(2, 3, 4, 5)) -> torch.Tensor:
    return torch.rand(*shape) * 4 + 0.05


def _prob(shape=(2, 3, 4, 5)) -> torch.Tensor:
    return torch.rand(*shape)


def _int(shape=(4, 6)) -> torch.Tensor:
    return torch.randint(-9, 10, shape)


def _grid() -> torch.Tensor:
    """Values on and around the branch points (0, ±0.5, ±1) plus signed zeros."""
    return torch.tensor([[-3.0, -1.0, -0.75, -0.5, -0.25, -0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 3.0]])


def _special() -> torch.Tensor:
    return torch.tensor([[math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5, -2.5, 1e30]])


def _any8() -> torch.Tensor:
    return torch.randn(3, 8) * 3


def _pos8() -> torch.Tensor:
    return torch.rand(3, 8) * 4 + 0.05


def _ties(shape=(3, 8)) -> torch.Tensor:
    return torch.randint(-2, 3, shape).float()


def _weights() -> torch.Tensor:
    return torch.tensor([[-0.75, -0.25, 0.0, 0.25, 0.49, 0.5, 0.75, 1.5]]).expand(3, 8).contiguous()


class PReLUModel(nn.Module):
    """nn.PReLU after a conv, so the channel axis (dim 1) is not the last one."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act = nn.PReLU(channels)
        with torch.no_grad():
            self.act.weight.copy_(torch.linspace(-2.0, 1.5, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


# name → (module, input factories)
CASES: dict[str, tuple[nn.Module, tuple[Callable[[], torch.Tensor], ...]]] = {
    "prelu_per_channel": (PReLUModel(4), (lambda: torch.randn(2, 3, 5, 6),)),
    "prelu_single": (PReLUModel(1), (lambda: torch.randn(2, 3, 5, 6),)),
    "prelu_tensor_weight": (Fn(lambda x, w: F.prelu(x, w)), (_any, lambda: torch.tensor([0.1, -0.5, 2.0]))),
    "prelu_rank2": (Fn(lambda x: F.prelu(x, torch.tensor([0.1, 0.2, 0.3]))), (lambda: torch.randn(4, 3),)),
    # slopes in (0, 1] lower to max(x, w·x), slopes ≥ 1 to min: NaN, ±inf and ±0 as torch
    "prelu_max_special": (Fn(lambda x: F.prelu(x, torch.linspace(0.05, 1.0, 8))), (_special,)),
    "prelu_min_special": (Fn(lambda x: F.prelu(x, torch.linspace(1.0, 3.0, 8))), (_special,)),
    "prelu_zero_slope_special": (Fn(lambda x: F.prelu(x, torch.linspace(0.0, 1.0, 8))), (_special,)),
    "prelu_module_default": (
        nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.PReLU()),
        (lambda: torch.randn(2, 3, 5, 6),),
    ),
    "glu_last": (nn.GLU(), (lambda: torch.randn(2, 3, 8),)),
    "glu_dim1": (nn.GLU(dim=1), (lambda: torch.randn(2, 6, 5),)),
    "logsigmoid": (nn.LogSigmoid(), (lambda: torch.randn(2, 3, 5) * 40,)),
    "softsign": (nn.Softsign(), (_any,)),
    "tanhshrink": (nn.Tanhshrink(), (_any,)),
    "softshrink": (nn.Softshrink(0.5), (_grid,)),
    "softshrink_lambda": (nn.Softshrink(1.3), (_any,)),
    "hardshrink": (nn.Hardshrink(), (_grid,)),
    "hardshrink_lambda": (nn.Hardshrink(0.75), (_any,)),
    "threshold": (nn.Threshold(0.25, -7.0), (_grid,)),
    "threshold_": (Fn(lambda x: F.threshold(x.clone(), 0.5, 2.0, inplace=True)), (_grid,)),
    "mish": (nn.Mish(), (lambda: torch.randn(2, 3, 5) * 10,)),
    "mish_": (Fn(lambda x: F.mish(x.clone(), inplace=True)), (_any,)),
    "celu": (nn.CELU(), (_any,)),
    "celu_alpha": (nn.CELU(alpha=0.4), (_any,)),
    "celu_": (Fn(lambda x: F.celu(x.clone(), 2.0, inplace=True)), (_any,)),
    "selu": (nn.SELU(), (_any,)),
    "selu_": (Fn(lambda x: F.selu(x.clone(), inplace=True)), (_any,)),
    "rrelu_eval": (nn.RReLU(0.1, 0.3), (_any,)),
    "rrelu_": (Fn(lambda x: F.rrelu(x.clone(), 0.2, 0.4, training=False, inplace=True)), (_any,)),
    "logit": (Fn(torch.logit), (lambda: torch.rand(2, 3, 5) * 0.98 + 0.01,)),
    "logit_eps": (Fn(lambda x: torch.logit(x, eps=0.1)), (_prob,)),
    "logit_": (Fn(lambda x: x.clone().logit_(1e-3)), (_prob,)),
    "lerp_scalar_low": (Fn(lambda x, y: torch.lerp(x, y, 0.3)), (_any, _any)),
    "lerp_scalar_high": (Fn(lambda x, y: torch.lerp(x, y, 0.8)), (_any, _any)),
    "lerp_tensor": (Fn(torch.lerp), (_any8, _any8, _weights)),
    "lerp_": (Fn(lambda x, y, w: x.clone().lerp_(y, w)), (_any8, _any8, _weights)),
    "addcmul": (Fn(lambda x, a, c: torch.addcmul(x, a, c, value=-0.5)), (_any, _any, _any)),
    "addcmul_broadcast": (Fn(torch.addcmul), (_any, lambda: torch.randn(5), lambda: torch.randn(4, 1))),
    "addcmul_int": (Fn(lambda x, a, c: torch.addcmul(x, a, c, value=3)), (_int, _int, _int)),
    "addcmul_": (Fn(lambda x, a, c: x.clone().addcmul_(a, c)), (_any, _any, _any)),
    "addcdiv": (Fn(lambda x, a, c: torch.addcdiv(x, a, c, value=2.0)), (_any, _any, _pos)),
    "addcdiv_": (Fn(lambda x, a, c: x.clone().addcdiv_(a, c, value=0.5)), (_any, _any, _pos)),
    "logaddexp": (Fn(torch.logaddexp), (lambda: torch.randn(3, 8) * 30, _ties)),
    "logaddexp_inf": (Fn(torch.logaddexp), (_special, _special)),
    "logaddexp2": (Fn(torch.logaddexp2), (lambda: torch.randn(3, 8) * 30, _ties)),
    "hypot": (Fn(torch.hypot), (_any, _any)),
    "hypot_": (Fn(lambda x, y: x.clone().hypot_(y)), (_any, _any)),
    "xlogy": (Fn(torch.xlogy), (_ties, _pos8)),
    "xlogy_nan": (
        Fn(torch.xlogy),
        (
            lambda: torch.tensor([[0.0, 0.0, 2.0, 1.0]]),
            lambda: torch.tensor([[0.0, math.nan, math.nan, 0.5]]),
        ),
    ),
    "xlogy_scalar_other": (Fn(lambda x: torch.xlogy(x, 3.0)), (_ties,)),
    "xlogy_scalar_self": (Fn(lambda y: torch.xlogy(2.0, y)), (_pos,)),
    "xlogy_scalar_self_zero": (
        Fn(lambda y: torch.xlogy(0.0, y)),
        (lambda: torch.tensor([[0.0, math.nan, math.inf, 2.0]]),),
    ),
    "xlogy_int": (Fn(torch.xlogy), (_int, lambda: torch.randint(0, 9, (4, 6)))),
    "xlogy_": (Fn(lambda x, y: x.clone().xlogy_(y)), (_ties, _pos8)),
    "copysign": (Fn(torch.copysign), (lambda: torch.randn(3, 12), _grid)),
    "copysign_special": (Fn(torch.copysign), (_grid, _grid)),
    "copysign_scalar": (Fn(lambda x: torch.copysign(x, -0.0)), (_any,)),
    "copysign_int": (Fn(torch.copysign), (_int, _int)),
    "copysign_": (Fn(lambda x, y: x.clone().copysign_(y)), (_any, _any)),
    "signbit": (Fn(torch.signbit), (_grid,)),
    "signbit_int": (Fn(torch.signbit), (_int,)),
    "frac": (Fn(torch.frac), (_any,)),
    "frac_": (Fn(lambda x: x.clone().frac_()), (_any,)),
    "heaviside": (Fn(torch.heaviside), (_ties, _any8)),
    "heaviside_": (Fn(lambda x, v: x.clone().heaviside_(v)), (_ties, _any8)),
    "deg2rad": (Fn(torch.deg2rad), (_any,)),
    "deg2rad_int": (Fn(torch.deg2rad), (_int,)),
    "deg2rad_": (Fn(lambda x: x.clone().deg2rad_()), (_any,)),
    "rad2deg": (Fn(torch.rad2deg), (_any,)),
    "rad2deg_": (Fn(lambda x: x.clone().rad2deg_()), (_any,)),
    "sinc": (Fn(torch.sinc), (lambda: torch.cat([_grid(), torch.randn(1, 12) * 3], 1),)),
    "sinc_": (Fn(lambda x: x.clone().sinc_()), (_any,)),
    "exp2": (Fn(torch.exp2), (_any,)),
    "exp2_": (Fn(lambda x: x.clone().exp2_()), (_any,)),
    "erfc": (Fn(torch.erfc), (_any,)),
    "erfc_": (Fn(lambda x: x.clone().erfc_()), (_any,)),
    "expit": (Fn(torch.special.expit), (_any,)),
    "nan_to_num": (Fn(torch.nan_to_num), (_special,)),
    "nan_to_num_args": (Fn(lambda x: torch.nan_to_num(x, nan=1.5, posinf=9.0, neginf=-8.0)), (_special,)),
    "nan_to_num_": (Fn(lambda x: x.clone().nan_to_num_(2.0)), (_special,)),
    "xlog1py": (Fn(torch.special.xlog1py), (_ties, _pos8)),
    "xlog1py_nan": (
        Fn(torch.special.xlog1py),
        (
            lambda: torch.tensor([[0.0, 0.0, 2.0, 1.0]]),
            lambda: torch.tensor([[0.0, math.nan, math.nan, -0.5]]),
        ),
    ),
    "xlog1py_scalar_other": (Fn(lambda x: torch.special.xlog1py(x, 3.0)), (_ties,)),
    "xlog1py_scalar_self": (Fn(lambda y: torch.special.xlog1py(2.0, y)), (_pos,)),
    "entr": (Fn(torch.special.entr), (lambda: torch.cat([_special(), _pos((1, 8))], 1),)),
    "ndtr": (Fn(torch.special.ndtr), (_any,)),
    "square_": (Fn(lambda x: x.clone().square_()), (_any,)),
    "log2_": (Fn(lambda x: x.clone().log2_()), (_pos,)),
    "log10_": (Fn(lambda x: x.clone().log10_()), (_pos,)),
    "prelu_kernel": (
        Fn(lambda x, w: torch.ops.aten._prelu_kernel(x, w)),
        (_any, lambda: torch.tensor([0.1, -0.5, 2.0]).reshape(3, 1, 1)),
    ),
    # direct ATen calls: F.*_loss first calls torch.broadcast_tensors, which has no rule yet
    "mse_loss": (Fn(lambda x, t: torch.ops.aten.mse_loss(x, t)), (_any, _any)),
    "mse_loss_none": (Fn(lambda x, t: torch.ops.aten.mse_loss(x, t, 0)), (_any, _any)),
    "l1_loss_sum": (Fn(lambda x, t: torch.ops.aten.l1_loss(x, t, 2)), (_any, _any)),
    "smooth_l1_loss": (Fn(lambda x, t: torch.ops.aten.smooth_l1_loss(x, t, 1, 0.5)), (_any8, _ties)),
    "smooth_l1_loss_beta0": (Fn(lambda x, t: torch.ops.aten.smooth_l1_loss(x, t, 2, 0.0)), (_any8, _ties)),
    "huber_loss": (Fn(lambda x, t: torch.ops.aten.huber_loss(x, t, 0, 2.0)), (_any8, _ties)),
    "huber_loss_mean": (Fn(lambda x, t: torch.ops.aten.huber_loss(x, t)), (_any8, _ties)),
    "multiply": (Fn(torch.multiply), (_any, _any)),
    "multiply_": (Fn(lambda x, y: torch.ops.aten.multiply_.Tensor(x.clone(), y)), (_any, _any)),
    "subtract": (Fn(lambda x, y: torch.subtract(x, y, alpha=2)), (_any, _any)),
    "subtract_": (Fn(lambda x, y: torch.ops.aten.subtract_.Tensor(x.clone(), y, alpha=3)), (_any, _any)),
    "divide": (Fn(torch.divide), (_any, _pos)),
    "divide_mode": (Fn(lambda x, y: torch.divide(x, y, rounding_mode="floor")), (_any, _pos)),
    "divide_": (Fn(lambda x, y: torch.ops.aten.divide_.Tensor(x.clone(), y)), (_any, _pos)),
    "true_divide": (Fn(torch.true_divide), (_int, lambda: torch.randint(1, 5, (4, 6)))),
    "true_divide_": (Fn(lambda x, y: torch.ops.aten.true_divide_.Tensor(x.clone(), y)), (_any, _pos)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_elementwise_extra(tmp_path, frontend, name):
    model, makes = CASES[name]
    export_and_check(model, [make() for make in makes], tmp_path, frontend)


def test_prelu_with_slopes_in_0_1_is_one_max(tmp_path):
    """nn.PReLU's default slope 0.25: no comparison and no select in the graph."""
    import tarfile

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.PReLU())
    report = export_and_check(model, [torch.randn(1, 3, 8, 8)], tmp_path)
    with tarfile.open(report.path) as tar:
        graph = tar.extractfile("graph.nnef").read().decode()
    assert " max(" in graph and "select(" not in graph and " gt(" not in graph
