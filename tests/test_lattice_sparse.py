"""The fast sparse library against the brute-force definitions in ``lattice.reference``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchlower import lattice as L
from torchlower.errors import InvalidArgumentError
from torchlower.lattice import reference as R


def cloud(
    n: int = 150, channels: int = 4, span: int = 8, stride: int = 1, batches: int = 2
) -> L.SparseTensor:
    coords = torch.cat(
        [torch.randint(0, batches, (n, 1)), torch.randint(-span, span, (n, 3)) * stride], dim=1
    )
    coords = torch.unique(coords, dim=0)
    coords = coords[torch.randperm(len(coords))]  # rows need not be sorted
    return L.SparseTensor(torch.randn(len(coords), channels), coords.int(), stride)


def to_ref(x: L.SparseTensor) -> R.Ref:
    ref = R.Ref.of(x.coords, x.feats, x.stride)
    for stride, coords in x.supports.items():
        ref.history.setdefault(stride, [tuple(c) for c in coords.tolist()])
    return ref


def assert_same(x: L.SparseTensor, ref: R.Ref, atol: float = 1e-5) -> None:
    order = sorted(range(len(x.coords)), key=lambda i: tuple(x.coords[i].tolist()))
    coords, feats = ref.sorted()
    assert x.stride == ref.stride
    assert torch.equal(x.coords[order], coords)
    torch.testing.assert_close(x.feats[order], feats, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("kernel,dilation", [(3, 1), (2, 1), ((3, 1, 2), 2)])
def test_subm_conv(kernel: int, dilation: int) -> None:
    x = cloud(stride=2)
    m = L.SubmConv3d(4, 6, kernel, dilation=dilation, bias=True)
    with torch.no_grad():
        assert_same(m(x), R.subm_conv(to_ref(x), m.weight, m.bias, m.kernel_size, m.dilation))


@pytest.mark.parametrize(
    "kernel,stride,padding,dilation", [(2, 2, 0, 1), (3, 2, 1, 1), (3, (1, 2, 3), (1, 0, 2), 2)]
)
def test_strided_conv_and_transpose(kernel: int, stride: int, padding: int, dilation: int) -> None:
    x = cloud()
    down = L.Conv3d(4, 5, kernel, stride, padding, dilation)
    up = L.ConvTranspose3d(5, 3, kernel, stride, padding, dilation, bias=True)
    with torch.no_grad():
        d = down(x)
        ref_d = R.conv(
            to_ref(x), down.weight, None, down.kernel_size, down.stride, down.padding, down.dilation
        )
        assert_same(d, ref_d)
        u = up(d)
        ref_u = R.conv_transpose(
            ref_d, up.weight, up.bias, up.kernel_size, up.stride, up.padding, up.dilation
        )
        assert_same(u, ref_u)
        assert torch.equal(u.coords, x.coords)  # the inverse conv restores the input support


def test_generative_transpose() -> None:
    x = cloud(stride=4, n=60)
    gen = L.GenerativeConvTranspose3d(4, 3, (2, 3, 2), (2, 2, 4), bias=True)
    with torch.no_grad():
        assert_same(
            gen(x), R.generative_conv_transpose(to_ref(x), gen.weight, gen.bias, gen.kernel_size, gen.stride)
        )


@pytest.mark.parametrize("cls,mode", [(L.MaxPool3d, "max"), (L.AvgPool3d, "avg"), (L.SumPool3d, "sum")])
def test_pools(cls: type, mode: str) -> None:
    x = cloud()
    pool = cls(3, 2, 1)
    assert_same(pool(x), R.pool(to_ref(x), mode, pool.kernel_size, pool.stride, pool.padding, pool.dilation))


def test_global_pools_and_feature_modules() -> None:
    x = cloud(batches=3)
    torch.testing.assert_close(L.GlobalAvgPool(4)(x), R.global_pool(to_ref(x), "avg", 4))
    torch.testing.assert_close(L.GlobalMaxPool()(x), R.global_pool(to_ref(x), "max", 3))
    for m in (
        nn.ReLU(),
        nn.GELU("tanh"),
        nn.Linear(4, 7),
        nn.LayerNorm(4),
        nn.Softplus(2, 10),
        L.BatchNorm(4).eval(),
    ):
        y = m(x)
        assert isinstance(y, L.SparseTensor) and y.coords is x.coords
        torch.testing.assert_close(y.feats, m(x.feats))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
@pytest.mark.parametrize("join", ["inner", "left", "right", "outer", None])
def test_binary_joins(op: str, join: str | None) -> None:
    a, b = cloud(n=80, span=4), cloud(n=80, span=4)
    out = getattr(L, op)(a, b, join, 0.5, -2.0)
    ref = R.binary(op, to_ref(a), to_ref(b), join or L.functional.DEFAULT_JOIN[op], 0.5, -2.0)
    assert_same(out, ref)


def test_operators_cat_reindex() -> None:
    a, b = cloud(n=80, span=4, channels=3), cloud(n=80, span=4, channels=3)
    assert_same(a + b, R.binary("add", to_ref(a), to_ref(b), "outer", 0.0, 0.0))
    assert_same(a * b, R.binary("mul", to_ref(a), to_ref(b), "inner", 0.0, 0.0))
    assert_same(a - b, R.binary("sub", to_ref(a), to_ref(b), "outer", 0.0, 0.0))
    for join in ("inner", "outer", "left"):
        assert_same(L.cat([a, b], join=join), R.cat([to_ref(a), to_ref(b)], join))
    assert_same(L.reindex_sparse(a, b, 1.5), R.reindex(to_ref(a), to_ref(b), 1.5))


@pytest.mark.parametrize("interpolation", ["nearest", "linear"])
def test_voxelize_devoxelize(interpolation: str) -> None:
    pts = torch.rand(300, 3) * 2 - 1
    feats = torch.randn(300, 5)
    batch = torch.randint(0, 2, (300,), dtype=torch.int32)
    active = torch.tensor([270], dtype=torch.int32)
    vs, org = (0.25, 0.2, 0.3), (-1.0, -1.0, -1.0)
    for reduction in ("mean", "sum"):
        v = L.voxelize(pts, feats, batch, active, vs, org, reduction)
        assert_same(v, R.voxelize(pts, feats, batch, 270, vs, org, reduction))
    coarse = L.Conv3d(5, 5, 2, 2)(v)
    with torch.no_grad():
        for x in (v, coarse):
            got = L.devoxelize(pts, x, batch, active, vs, org, interpolation)
            want = R.devoxelize(pts, to_ref(x), batch, 270, vs, org, interpolation)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert got[270:].abs().sum() == 0 and got[:270].abs().sum() > 0


def test_typed_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="divisible by the stride"):
        L.SparseTensor(torch.zeros(1, 2), torch.tensor([[0, 1, 2, 2]]), 2)
    with pytest.raises(InvalidArgumentError, match="join"):
        L.add(cloud(), cloud(), "sideways")
    with pytest.raises(InvalidArgumentError, match="support at stride"):
        L.ConvTranspose3d(4, 4, 2, 2)(cloud(stride=2))


def test_batch_counts_and_aliases() -> None:
    x = cloud(batches=3)
    assert x.F is x.feats and x.C is x.coords
    assert int(x.batch_counts().sum()) == len(x.coords)
