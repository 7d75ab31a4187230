"""The sparse engine against a frozen copy of itself from before issue 17
(``tests/lattice_kernels_oracle.py``): the same output coordinates in the same row order and the
same per-offset pair lists (integers: exactly), the same pools (exactly: see ``test_pools``) and
the same conv features within float32 rounding (``within_rounding``) — and bit for bit the same
at any thread count.

Why conv features are not compared bit for bit with the oracle: its gather → matmul and the
engine's im2col chunks, per-offset or per-input GEMMs are products of different shapes, and a BLAS
may block, vectorize and fuse each shape differently on each CPU (issue 26: equal on the Xeon
this was written on, one rounding apart on a Zen 4; on the Xeon too with
``MKL_ENABLE_INSTRUCTIONS=AVX2`` or ``MKL_CBWR=COMPATIBLE``). Bit for bit is asserted only where
it holds by construction: the same kernel on the same shapes (1 vs 2 threads: the chunking does
not depend on the thread count and every GEMM runs single-threaded, ``threads.py``; a repeated
call), integer maps, data movement, and pools (a max returns one of its operands; sums add the
same floats in the same order).
"""

from __future__ import annotations

import pytest
import torch

from tests import lattice_kernels_oracle as O
from torchlower import lattice as L
from torchlower.lattice import kernels

U = 2.0**-24  # float32 unit roundoff (round to nearest)
TINY = 2.0**-126  # smallest normal float32: what one operation can lose to underflow / flush-to-zero


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


def gamma(n: int) -> float:
    """Higham's ``γ_n = n·u / (1 − n·u)``."""
    return n * U / (1 - n * U)


def within_rounding(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor, terms: int) -> None:
    """``got`` and ``want`` are two float32 evaluations of the same sums of at most ``terms``
    products each (``Σ aᵢ·bᵢ``, a bias counting as ``b·1``), in any order, blocking and chunking,
    with or without FMA; ``magnitude`` is the same computation on the operands' absolute values
    (``Σ |aᵢ·bᵢ|``, in float64). Each evaluation is within ``γ_n·Σ|aᵢ·bᵢ|`` of the exact sum
    whatever its order (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1,
    (3.4)–(3.5); with a rounding per operation, FMA only tightens it), so two evaluations are
    at most ``2·γ_n·magnitude`` apart, elementwise. Chained layers compose the same way: an input
    error ``e`` reaches the next sum as ``|W|·e``, so ``n`` is the number of terms summed along the
    chain (``γ_a + γ_b + γ_a·γ_b ≤ γ_{a+b}``, Lemma 3.3). Widened by ``2⁻⁴⁰`` relative (the
    float64 rounding of the magnitude, ≤ ``n·2⁻⁵³``) and ``n`` smallest normals (underflow, which
    never happens with these values). This is all a BLAS may change between shapes, threads and
    CPUs; a wrong pair, offset or weight moves an output by a whole term, thousands of times more.
    """
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
    bound = 2 * gamma(terms) * magnitude.double() * (1 + 2**-40) + terms * TINY
    diff = (got.double() - want.double()).abs()
    if not bool((diff <= bound).all()):
        worst = int((diff / bound).argmax())
        raise AssertionError(
            f"|got − want| = {diff.view(-1)[worst]:.3g} > 2·γ_{terms}·magnitude = "
            f"{bound.view(-1)[worst]:.3g} at flat index {worst} "
            f"({int((diff > bound).sum())} of {diff.numel()} elements)"
        )


def check_conv(x: L.SparseTensor, kmap: kernels.KernelMap, old: O.KernelMap, kernel: tuple) -> None:
    """Every conv method (the default choice, each forced one, im2col in 7-row chunks) against the
    oracle's gather → matmul: the same sums of ``K·I`` products and the bias per output, as GEMMs
    of other shapes (``within_rounding``; exactly equal nowhere by construction, not even im2col
    or outputs with one pair: the oracle's ``[M, K·I]`` rows against the engine's chunks or
    ``[N, I] @ [I, K·O]`` products, which a BLAS may round differently)."""
    same_pairs(kmap, old)
    w = torch.randn(3, *kernel, x.num_channels)
    b = torch.randn(3)
    want = O.apply_conv(x.feats, old, w, b)
    magnitude = O.apply_conv(x.feats.abs().double(), old, w.abs().double(), b.abs().double())
    terms = w[0].numel() + 1  # K·I products and the bias
    for method in ("auto", "im2col", "pairs", "inputs"):
        within_rounding(kernels.apply_conv(x.feats, kmap, w, b, method=method), want, magnitude, terms)
    within_rounding(kernels.apply_conv(x.feats, kmap, w, b, chunk=7, method="im2col"), want, magnitude, terms)


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
    # Bit for bit by construction, on any CPU: a max returns one of its operands, whatever the
    # order; sum and mean add each output's inputs one at a time in offset order in both
    # (embedding_bag, the oracle's scatter_reduce: one row, one add after the other, on CPU)
    # and divide by the same count — the same correctly rounded IEEE operations in the same
    # order, no products, no BLAS (the SIMD width only changes which channels go together).
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


def oracle_network(x: L.SparseTensor, magnitude: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``network`` by the oracle; ``magnitude``: on the absolute values of the features, weights
    and biases, in float64 — every output's ``Σ|terms|`` for ``within_rounding``."""
    torch.manual_seed(1)
    c = x.num_channels
    mods = [
        L.SubmConv3d(c, 6, 3, bias=True),
        L.Conv3d(6, 8, 2, 2),
        L.SubmConv3d(8, 8, (3, 2, 3), dilation=(1, 2, 1)),
        L.ConvTranspose3d(8, 6, 2, 2, bias=True),
        L.GenerativeConvTranspose3d(8, 4, 2, 2),
    ]

    def value(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or not magnitude else t.detach().abs().double()

    stem, down, mid, up, gen = ((value(m.weight), value(m.bias)) for m in mods)
    s = x.stride
    ma = O.subm_map(x.coords, s, (3, 3, 3), (1, 1, 1))
    a = O.apply_conv(value(x.feats), ma, *stem)  # type: ignore[arg-type]
    mb = O.conv_map(x.coords, s, (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    b = O.apply_conv(a, mb, *down)  # type: ignore[arg-type]
    mm = O.subm_map(mb.out_coords, mb.out_stride, (3, 2, 3), (1, 2, 1))
    m = O.apply_conv(b, mm, *mid)  # type: ignore[arg-type]
    mu = O.transpose_map(mb.out_coords, mb.out_stride, x.coords, (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    mg = O.generative_map(mb.out_coords, mb.out_stride, (2, 2, 2), (2, 2, 2))
    mp = O.conv_map(x.coords, s, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))
    mavg = O.conv_map(x.coords, s, (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    return [
        (x.coords, a),
        (mb.out_coords, b),
        (mb.out_coords, m),
        (x.coords, O.apply_conv(m, mu, *up)),  # type: ignore[arg-type]
        (mg.out_coords, O.apply_conv(m, mg, *gen)),  # type: ignore[arg-type]
        (mp.out_coords, O.apply_pool(a, mp, "max")),
        (mavg.out_coords, O.apply_pool(a, mavg, "avg")),
        (x.coords, a),
    ]


def network_terms(c: int) -> list[int]:
    """Per output of ``network``: the terms summed along its chain of layers (``K·I`` products per
    conv, +1 for a bias; a max pool adds none, a mean ``K`` sums and one division)."""
    stem = 27 * c + 1
    down = stem + 8 * 6
    mid = down + 18 * 8
    return [stem, down, mid, mid + 8 * 8 + 1, mid + 8 * 8, stem, stem + 8 + 1, stem]


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_modules_match_oracle(name: str) -> None:
    x = cloud(**CLOUDS[name])  # type: ignore[arg-type]
    with torch.no_grad():
        want = oracle_network(x)
        magnitudes = oracle_network(x, magnitude=True)
    got = network(x)
    terms = network_terms(x.num_channels)
    for y, (coords, feats), (_, magnitude), n in zip(got, want, magnitudes, terms, strict=True):
        assert torch.equal(y.coords, coords)
        within_rounding(y.feats, feats, magnitude, n)
    # the same layer on the same voxels again: the same kernel on the same shapes, bit for bit
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


@pytest.mark.parametrize("name", ["dense", "sparse"])
def test_gradients_match_oracle(name: str) -> None:
    """Training works: autograd through every conv method and pool equals the oracle's, within
    float32 rounding. The loss ``Σ y²`` has ``∂/∂x = Aᵀ·2y`` and ``∂/∂W = Xᵀ·2y``: the forward's
    ``K·I`` terms, then ``K·O`` per feature (each input reaches ``K`` outputs of ``O`` channels)
    or one per row per weight; their magnitudes are the same gradients of the oracle over absolute
    values. The pools add ≤ ``K`` ones (max) and ≤ ``K`` reciprocals (mean) to a feature's
    gradient: ``2K`` more magnitude, ``K + 1`` more terms, and 3 additions join the parts."""
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
        f_abs = x.feats.abs().double().requires_grad_(True)
        w_abs = w0.abs().double().requires_grad_(True)
        O.apply_conv(f_abs, old, w_abs, None).square().sum().backward()
        volume, (out_ch, in_ch) = w0[0, ..., 0].numel(), (w0.shape[0], w0.shape[-1])
        rows = max(len(x.coords), new.rows)  # the weight gradient sums over outputs or inputs
        f_terms, w_terms = volume * (in_ch + out_ch + 1) + 4, volume * in_ch + rows
        pooled = grads[4][0] + grads[5][0]
        for f_grad, w_grad in grads[1:4]:
            within_rounding(f_grad + pooled, grads[0][0], f_abs.grad + 2 * volume, f_terms)  # type: ignore[operator]
            within_rounding(w_grad, grads[0][1], w_abs.grad, w_terms)  # type: ignore[arg-type]


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
        assert torch.equal(out, bias.expand(len(y.coords), 3))  # 0 + b = b: exact


def test_subm_map_in_lookup_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dense-grid lookup split into many row chunks gives the same table."""
    monkeypatch.setattr(L.maps, "LOOKUP_ROWS", 100)
    x = cloud(n=1400, span=4)
    same_pairs(
        kernels.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1)),
        O.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1)),
    )
