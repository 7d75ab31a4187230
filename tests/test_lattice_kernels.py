"""The sparse engine against a frozen copy of itself from before issue 17
(``tests/lattice_kernels_oracle.py``): the same output coordinates in the same row order, the
same per-offset pair lists, the same features — bit for bit (``torch.equal``) for the default
method choice except sums below ``kernels.EXACT_FILL`` (and for forced methods that add
per-offset products in another order: to rounding) — at any thread count.
"""

from __future__ import annotations

import pytest
import torch

from tests import lattice_kernels_oracle as O
from torchlower import lattice as L
from torchlower.lattice import gather, kernels, pools


def cloud(
    n: int,
    span: int,
    stride: int = 1,
    batches: int = 2,
    channels: int = 5,
    far: bool = False,
    seed: int = 0,
) -> L.SparseTensor:
    """Random distinct voxels in shuffled row order; ``far`` adds one voxel ~10⁶ cells away so
    the bounding box is too large for a dense grid (the sorted-keys path)."""
    g = torch.Generator().manual_seed(seed)
    coords = torch.cat(
        [torch.randint(0, batches, (n, 1), generator=g), torch.randint(-span, span, (n, 3), generator=g)], 1
    )
    if far:
        coords = torch.cat([coords, torch.tensor([[0, 1_000_003, -7, 2]])])
    coords = torch.unique(coords, dim=0) * torch.tensor([1, stride, stride, stride])
    coords = coords[torch.randperm(len(coords), generator=g)]
    feats = torch.randn(len(coords), channels, generator=g)
    return L.SparseTensor(feats, coords.int(), stride)


# dense (im2col, fill ≳ 50 %), sparse (per-offset pairs), far (sorted keys), strided + 3 batches
CLOUDS = {
    "dense": dict(n=1400, span=4),
    "sparse": dict(n=200, span=8),
    "far": dict(n=600, span=4, far=True),
    "stride2": dict(n=500, span=4, stride=2, batches=3),
}


def same_pairs(new: kernels.KernelMap, old: O.KernelMap) -> None:
    assert torch.equal(new.out_coords, old.out_coords) and new.out_stride == old.out_stride
    assert len(new.pairs) == len(old.pairs)
    for (k, i, o), (k0, i0, o0) in zip(new.pairs, old.pairs, strict=True):
        assert k == k0 and torch.equal(i, i0) and torch.equal(o, o0)


def same_feats(new: torch.Tensor, old: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(new, old)
    else:
        # another summation order: float32 rounding of sums of up to K·I terms
        torch.testing.assert_close(
            new, old, rtol=1e-5, atol=4e-6 * max(1.0, float(old.abs().amax())) if old.numel() else 0.0
        )


def check_conv(x: L.SparseTensor, kmap: kernels.KernelMap, old: O.KernelMap, kernel: tuple) -> None:
    """Both conv methods against the oracle's gather → matmul (im2col is the same arithmetic)."""
    same_pairs(kmap, old)
    w = torch.randn(3, *kernel, x.num_channels)
    b = torch.randn(3)
    want = O.apply_conv(x.feats, old, w, b)
    volume = w[0, ..., 0].numel()
    single = bool(len(old.pairs) == 0 or (torch.bincount(old.flat()[1], minlength=old.rows).max() <= 1))
    for method in ("im2col", "pairs", "inputs"):
        got = kernels.apply_conv(x.feats, kmap, w, b, method=method)
        same_feats(got, want, exact=method == "im2col" or single)  # one pair: any order is exact
    # auto is exact unless some output sums pairs at a LiDAR-like fill (below EXACT_FILL)
    auto = kernels.apply_conv(x.feats, kmap, w, b)
    same_feats(auto, want, exact=single or kmap.fill(volume) >= kernels.EXACT_FILL)
    same_feats(kernels.apply_conv(x.feats, kmap, w, b, chunk=7, method="im2col"), want, exact=False)


def triple3(value: int | tuple) -> tuple[int, int, int]:
    return L.sparse.triple(value, "value")


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("kernel,dilation", [(3, 1), (2, 1), (4, 1), ((3, 1, 2), 2), (5, (1, 2, 1)), (1, 1)])
def test_subm_map_and_conv(name: str, kernel: int | tuple, dilation: int | tuple) -> None:
    x = cloud(**CLOUDS[name])  # type: ignore[arg-type]
    k, d = triple3(kernel), L.sparse.triple(dilation, "d")
    check_conv(x, kernels.subm_map(x.coords, x.stride, k, d), O.subm_map(x.coords, x.stride, k, d), k)


STRIDED = [
    (2, 2, 0, 1),
    (3, 2, 1, 1),
    (3, (1, 2, 3), (1, 0, 2), 2),
    (4, 2, 1, 1),
    (1, 1, 0, 1),
    (2, 3, 0, 1),  # kernel < stride: some transposed-conv targets get no pair
    ((2, 3, 1), (2, 1, 1), (0, 1, 0), (1, 1, 2)),
    (2, 3, 1, 1),  # kernel ≤ stride with padding: the one-offset-per-axis path
    ((1, 2, 3), (1, 2, 3), (0, 1, 2), 1),
]


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("kernel,stride,padding,dilation", STRIDED)
def test_strided_and_transposed(name: str, kernel, stride, padding, dilation) -> None:
    x = cloud(**CLOUDS[name])  # type: ignore[arg-type]
    k = triple3(kernel)
    geo = tuple(L.sparse.triple(v, "g") for v in (stride, padding, dilation))
    down, old_down = kernels.conv_map(x.coords, x.stride, k, *geo), O.conv_map(x.coords, x.stride, k, *geo)
    check_conv(x, down, old_down, k)
    y = L.SparseTensor(torch.randn(down.rows, 4), down.out_coords, down.out_stride, check=False)
    old_up = O.transpose_map(y.coords, y.stride, x.coords, k, *geo)
    # from the cached conv map (inverted) and built directly from the target support
    check_conv(y, kernels.transpose_map(y.coords, y.stride, x.coords, k, *geo, conv=down), old_up, k)
    check_conv(y, kernels.transpose_map(y.coords, y.stride, x.coords, k, *geo), old_up, k)


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("kernel,stride", [(2, 2), ((2, 3, 2), (2, 2, 1)), (3, 2), (1, 1)])
def test_generative(name: str, kernel, stride) -> None:
    spec = dict(CLOUDS[name])
    spec["stride"] = 2 * int(spec.get("stride", 1))  # type: ignore[call-overload]
    x = cloud(**spec)  # type: ignore[arg-type]
    k, s = triple3(kernel), L.sparse.triple(stride, "s")
    check_conv(
        x, kernels.generative_map(x.coords, x.stride, k, s), O.generative_map(x.coords, x.stride, k, s), k
    )


@pytest.mark.parametrize("name", sorted(CLOUDS))
@pytest.mark.parametrize("kernel,stride,padding,dilation", STRIDED)
@pytest.mark.parametrize("mode", ["max", "avg", "sum"])
def test_pools(name: str, kernel, stride, padding, dilation, mode: str) -> None:
    x = cloud(**CLOUDS[name])  # type: ignore[arg-type]
    geo = (L.sparse.triple(kernel, "k"), *(L.sparse.triple(v, "g") for v in (stride, padding, dilation)))
    new, old = kernels.conv_map(x.coords, x.stride, *geo), O.conv_map(x.coords, x.stride, *geo)
    assert torch.equal(kernels.apply_pool(x.feats, new, mode), O.apply_pool(x.feats, old, mode))


def network(x: L.SparseTensor) -> list[L.SparseTensor]:
    """Every module once, sharing maps the way a U-Net does."""
    torch.manual_seed(1)
    c = x.num_channels
    stem = L.SubmConv3d(c, 6, 3, bias=True)
    down = L.Conv3d(6, 8, 2, 2)
    mid = L.SubmConv3d(8, 8, (3, 2, 3), dilation=(1, 2, 1))
    up = L.ConvTranspose3d(8, 6, 2, 2, bias=True)
    gen = L.GenerativeConvTranspose3d(8, 4, 2, 2)
    pool = L.MaxPool3d(3, 2, 1)
    avg = L.AvgPool3d(2, 2)
    with torch.no_grad():
        a = stem(x)
        b = down(a)
        m = mid(b)
        u = up(m)
        return [a, b, m, u, gen(m), pool(a), avg(a), stem(x)]


def oracle_network(x: L.SparseTensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(1)
    c = x.num_channels
    mods = [
        L.SubmConv3d(c, 6, 3, bias=True),
        L.Conv3d(6, 8, 2, 2),
        L.SubmConv3d(8, 8, (3, 2, 3), dilation=(1, 2, 1)),
        L.ConvTranspose3d(8, 6, 2, 2, bias=True),
        L.GenerativeConvTranspose3d(8, 4, 2, 2),
    ]
    stem, down, mid, up, gen = mods
    s = x.stride
    ma = O.subm_map(x.coords, s, (3, 3, 3), (1, 1, 1))
    a = O.apply_conv(x.feats, ma, stem.weight, stem.bias)
    mb = O.conv_map(x.coords, s, (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    b = O.apply_conv(a, mb, down.weight, None)
    mm = O.subm_map(mb.out_coords, mb.out_stride, (3, 2, 3), (1, 2, 1))
    m = O.apply_conv(b, mm, mid.weight, None)
    mu = O.transpose_map(mb.out_coords, mb.out_stride, x.coords, (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    mg = O.generative_map(mb.out_coords, mb.out_stride, (2, 2, 2), (2, 2, 2))
    mp = O.conv_map(x.coords, s, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    mavg = O.conv_map(x.coords, s, (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    return [
        (x.coords, a),
        (mb.out_coords, b),
        (mb.out_coords, m),
        (x.coords, O.apply_conv(m, mu, up.weight, up.bias)),
        (mg.out_coords, O.apply_conv(m, mg, gen.weight, None)),
        (mp.out_coords, O.apply_pool(a, mp, "max")),
        (mavg.out_coords, O.apply_pool(a, mavg, "avg")),
        (x.coords, a),
    ]


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_modules_match_oracle(name: str) -> None:
    x = cloud(**CLOUDS[name])  # type: ignore[arg-type]
    with torch.no_grad():
        want = oracle_network(x)
    got = network(x)
    for y, (coords, feats) in zip(got, want, strict=True):
        assert torch.equal(y.coords, coords)
        if name == "sparse":  # fill below EXACT_FILL: per-offset sums, float32 rounding apart
            torch.testing.assert_close(y.feats, feats, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(y.feats, feats)
    assert got[-1].feats.data_ptr() != got[0].feats.data_ptr() and torch.equal(got[-1].feats, got[0].feats)


def test_maps_are_cached_on_the_coordinate_set() -> None:
    x = cloud(**CLOUDS["dense"])  # type: ignore[arg-type]
    again = L.SparseTensor(torch.randn(len(x.coords), 5), x.coords, check=False)  # same coords object
    conv = L.SubmConv3d(5, 5, 3)
    with torch.no_grad():
        conv(x)
        assert again.cache is x.cache and len(x.cache) == 1
        conv(again)
        L.SubmConv3d(5, 2, 3)(x.replace(x.feats * 2))
        assert len(x.cache) == 1  # one map for every layer of this geometry on these voxels
        down = L.Conv3d(5, 5, 2, 2)(x)
        L.ConvTranspose3d(5, 5, 2, 2)(down)  # inverts the cached conv map
    assert any(isinstance(k, tuple) and k[0] == "transpose_map" for k in down.cache)


@pytest.mark.parametrize("name,span", [("dense", 6), ("sparse", 10), ("far", 8)])
def test_thread_count_independence(name: str, span: int) -> None:
    """1 and 2 threads give bit-identical outputs on clouds big enough for several chunks and
    blocks (span 6: ~85 % occupied, im2col; span 10: ~30 %, pairs; far: sorted-keys maps)."""
    spec = dict(CLOUDS[name], n=6000, span=span, channels=16)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x = cloud(**spec)  # type: ignore[arg-type]
            runs.append(network(x))
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*runs, strict=True):
        assert torch.equal(one.coords, two.coords)
        assert torch.equal(one.feats, two.feats)


@pytest.mark.parametrize("name", ["dense", "sparse"])
def test_gradients_match_oracle(name: str) -> None:
    """Training works: autograd through every conv method and pool equals the oracle's."""
    x = cloud(**CLOUDS[name])  # type: ignore[arg-type]
    geo = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    maps = [
        (
            kernels.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1)),
            O.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1)),
        ),
        (kernels.conv_map(x.coords, x.stride, *geo), O.conv_map(x.coords, x.stride, *geo)),
    ]
    for new, old in maps:
        kernel = (3, 3, 3) if new.out_coords is x.coords else (2, 2, 2)
        w0 = torch.randn(4, *kernel, x.num_channels)
        grads = []
        for run in ["oracle", "im2col", "pairs", "inputs", "max", "avg"]:
            f = x.feats.clone().requires_grad_(True)
            w = w0.clone().requires_grad_(True)
            if run == "oracle":
                conv = O.apply_conv(f, old, w, None).square().sum()
                y = conv + O.apply_pool(f, old, "max").sum() + O.apply_pool(f, old, "avg").sum()
            elif run in ("max", "avg"):
                y = kernels.apply_pool(f, new, run).sum()
            else:
                y = kernels.apply_conv(f, new, w, None, method=run).square().sum()
            y.backward()
            grads.append((f.grad, w.grad))
        pooled = grads[4][0] + grads[5][0]
        for f_grad, w_grad in grads[1:4]:
            same_feats(f_grad + pooled, grads[0][0], exact=False)
            same_feats(w_grad, grads[0][1], exact=False)


def test_empty_inputs() -> None:
    """No voxels in: no voxels out (or zeros + bias on a transposed conv's target support)."""
    x = L.SparseTensor(torch.zeros(0, 5), torch.zeros(0, 4, dtype=torch.int32))
    with torch.no_grad():
        assert L.SubmConv3d(5, 3, 3)(x).feats.shape == (0, 3)
        assert L.MaxPool3d(2)(x).feats.shape == (0, 5)
        y = cloud(**CLOUDS["dense"])  # type: ignore[arg-type]
        geo = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
        kmap = kernels.transpose_map(x.coords, (2, 2, 2), y.coords, *geo)
        bias = torch.randn(3)
        out = kernels.apply_conv(x.feats, kmap, torch.randn(3, 2, 2, 2, 5), bias)
        assert torch.equal(out, bias.expand(len(y.coords), 3))


def test_subm_map_in_lookup_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dense-grid lookup split into many row chunks gives the same table."""
    monkeypatch.setattr(L.maps, "LOOKUP_ROWS", 100)
    x = cloud(n=1400, span=4)
    same_pairs(
        kernels.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1)),
        O.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1)),
    )


def every_module(x: L.SparseTensor) -> list[torch.Tensor]:
    """Every sparse module once, wide enough (``K·I = 864`` in, 64 out) that a multi-threaded
    MKL GEMM would round differently from a single-threaded one."""
    torch.manual_seed(2)
    c = x.num_channels
    stem = L.SubmConv3d(c, 64, 3, bias=True)
    a = stem(x)
    b = L.Conv3d(64, 16, 2, 2)(a)
    up = L.ConvTranspose3d(16, 64, 2, 2)(b)
    outs = [
        a,
        b,
        up,
        L.GenerativeConvTranspose3d(16, 64, 3, 2)(b),
        L.NormalizedSubmConv3d(16, 64, 3, eps=1e-3)(b),
        L.NormalizedConvTranspose3d(16, 64, 2, 2)(b),
        L.NormalizedGenerativeConvTranspose3d(16, 64, 2, 2)(b),
        L.Conv3d(64, 64, 3, 2, 1)(a, b),  # onto a given target support
        L.MaxPool3d(3, 2, 1)(a),
        L.AvgPool3d(2, 2)(a),
        L.SumPool3d(2, 2)(a),
        L.PoolTranspose3d(2, 2)(b, x),
        L.TrilinearUpsample3d(2)(b, x),
    ]
    feats = [o.feats for o in outs] + [L.GlobalAvgPool()(a), L.GlobalMaxPool()(a)]
    return feats + [o.coords for o in outs]


@pytest.mark.parametrize("n,span", [(3000, 5), (900, 3)])  # many chunks and blocks; a tiny layer
def test_every_module_thread_count_independent(n: int, span: int) -> None:
    x = cloud(n=n, span=span, channels=32, seed=3)
    before = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 1):
            torch.set_num_threads(count)
            with torch.no_grad():
                runs.append(every_module(x))
            assert torch.get_num_threads() == count  # the kernels restore the caller's setting
    finally:
        torch.set_num_threads(before)
    for one, two, again in zip(*runs, strict=True):
        assert torch.equal(one, two) and torch.equal(one, again)


def test_strided_bags_gather_in_chunks() -> None:
    """The strided convs' bag gather (no padded copy) split into many 64-row chunks: bit for
    bit the oracle (every chunk ≥ 16 rows) and the same at 1 and 2 threads."""
    x = cloud(n=3000, span=5, channels=32, seed=3)
    geo = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    kmap = kernels.conv_map(x.coords, x.stride, *geo)
    assert kmap.rows * 8 <= kernels.BAGS_SLOTS * len(x.coords) and kmap.rows % 64 >= 16
    w = torch.randn(16, 2, 2, 2, 32)
    want = O.apply_conv(x.feats, O.conv_map(x.coords, x.stride, *geo), w, None)
    before = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                chunked = kernels.apply_conv(x.feats, kmap, w, None, chunk=64, method="im2col")
                assert torch.equal(chunked, want)
                assert torch.equal(kernels.apply_conv(x.feats, kmap, w, None), want)
    finally:
        torch.set_num_threads(before)


def test_transposed_inputs_in_disjoint_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transposed and generative convs' products in many small chunks whose input ranges
    do not overlap (each input multiplied once; no chunk's GEMM below MIN_CHUNK_ROWS rows): bit for bit
    the oracle at 1 and 2 threads."""
    monkeypatch.setattr(kernels, "INPUTS_FLOATS", 100 * 8 * 16)  # ~100 input rows a chunk
    x = cloud(n=3000, span=5, channels=16, seed=3)
    c = x.coords.long() + 64  # rows in lexicographic order, as voxelize makes them: local chunks
    x = L.SparseTensor(
        x.feats, x.coords[(((c[:, 0] * 128 + c[:, 1]) * 128 + c[:, 2]) * 128 + c[:, 3]).argsort()]
    )
    geo = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    down = kernels.conv_map(x.coords, x.stride, *geo)
    y = L.SparseTensor(torch.randn(down.rows, 16), down.out_coords, down.out_stride, check=False)
    w = torch.randn(16, 2, 2, 2, 16)
    maps = {
        "up": (
            kernels.transpose_map(y.coords, y.stride, x.coords, *geo, conv=down),
            O.transpose_map(y.coords, y.stride, x.coords, *geo),
        ),
        "gen": (
            kernels.generative_map(y.coords, y.stride, (2, 2, 2), (2, 2, 2)),
            O.generative_map(y.coords, y.stride, (2, 2, 2), (2, 2, 2)),
        ),
    }
    before = torch.get_num_threads()
    try:
        for kmap, old in maps.values():
            plan = kernels._inputs_plan(kmap, down.rows, 8, 16)
            assert len(plan) > 4 and sum(hi - lo for _, _, lo, hi, _, _ in plan) == down.rows
            assert min(hi - lo for _, _, lo, hi, _, _ in plan) >= gather.MIN_CHUNK_ROWS
            want = O.apply_conv(y.feats, old, w, None)
            for count in (1, 2):
                torch.set_num_threads(count)
                with torch.no_grad():
                    assert torch.equal(kernels.apply_conv(y.feats, kmap, w, None, method="inputs"), want)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2)])
def test_max_pool_slot_major_chunks(monkeypatch: pytest.MonkeyPatch, kernel: int, stride: int) -> None:
    """The max pool's slot-major gather in many chunks (the last one short), with NaN and ±inf
    among the features: exactly the oracle's scatter-reduce (NaN where it has NaN), at 1 and 2
    threads."""
    monkeypatch.setattr(pools, "POOL_FLOATS", 37 * kernel**3 * 8)  # 37 output rows a chunk
    x = cloud(n=3000, span=5, channels=8, seed=5)
    feats = x.feats.clone()
    feats[::7, 1], feats[::11, 2], feats[::13, 3] = float("nan"), float("inf"), float("-inf")
    geo = ((kernel,) * 3, (stride,) * 3, (0, 0, 0), (1, 1, 1))
    new, old = kernels.conv_map(x.coords, x.stride, *geo), O.conv_map(x.coords, x.stride, *geo)
    assert new.rows > 4 * 37 and new.rows % 37 != 0
    want = O.apply_pool(feats, old, "max")
    before = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                got = kernels.apply_pool(feats, new, "max")
                torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # NaN ≠ NaN
    finally:
        torch.set_num_threads(before)
