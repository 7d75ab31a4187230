"""The ops the fixtures do not cover: target / normalized convs, pool transpose, trilinear
upsampling, embedding lookup, RMS norm, softmax, elementwise — eager against the reference
executor on random clouds (``save`` checks the example and two fresh inputs, rows sorted),
float32 and int4 / int8 weights; and every one of the 31 dialect ops in saved artifacts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from torchlower import lattice as L
from torchlower.lattice import verify

pytest.importorskip("torchlower.fx", reason="lattice.save lowers through the FX front end")

ALL_OPS = {
    *("weight", "sparse.make", "sparse.decompose", "sparse.with_features", "sparse.reindex"),
    *("conv3d", "subm_conv3d", "normalized_subm_conv3d", "target_conv3d", "conv_transpose3d"),
    *("target_conv_transpose3d", "normalized_conv_transpose3d", "target_normalized_conv_transpose3d"),
    *("generative_conv_transpose3d", "normalized_generative_conv_transpose3d", "pool3d", "pool_transpose3d"),
    *("trilinear_upsample3d", "global_pool", "voxelize", "devoxelize", "linear", "embedding_lookup"),
    *("elementwise", "softmax", "activation", "batch_norm", "layer_norm", "rms_norm", "sparse.binary"),
    "sparse.cat",
}


def cloud(n: int = 70, channels: int = 4, span: int = 4, batches: int = 2) -> L.SparseTensor:
    coords = torch.cat([torch.randint(0, batches, (n, 1)), torch.randint(-span, span, (n, 3))], dim=1)
    coords = torch.unique(coords, dim=0).int()
    return L.SparseTensor(torch.randn(len(coords), channels), coords[torch.randperm(len(coords))])


class TargetConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down = L.Conv3d(4, 5, 2, stride=2, bias=True)
        self.onto = L.Conv3d(4, 5, 3, stride=2, padding=1, dilation=1, bias=True)
        self.up = L.ConvTranspose3d(5, 4, 3, stride=2, padding=1, bias=True)
        self.gen = L.GenerativeConvTranspose3d(5, 4, 2, stride=2)

    def forward(self, x):
        d = self.down(x)
        t = self.onto(x, d) + d  # target_conv3d: onto d's voxels
        return self.up(t, x), self.gen(t, x)  # target_conv_transpose3d (twice)


class Normalized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = L.NormalizedSubmConv3d(4, 6, 3, bias=True, eps=1e-5)
        self.point = L.NormalizedSubmConv3d(6, 6, 1)  # pointwise: the plain conv
        self.down = L.Conv3d(6, 6, 2, stride=2)
        self.up = L.NormalizedConvTranspose3d(6, 4, 2, stride=2, bias=True)
        self.gen = L.NormalizedGenerativeConvTranspose3d(6, 4, 2, stride=2, eps=1e-3)
        self.onto = L.NormalizedConvTranspose3d(6, 4, 3, stride=2, padding=1)
        self.gen_onto = L.NormalizedGenerativeConvTranspose3d(6, 4, 2, stride=2, bias=True)

    def forward(self, x):
        d = self.down(self.point(self.a(x)))
        return self.up(d), self.gen(d), self.onto(d, x), self.gen_onto(d, x)


class Upsample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = L.AvgPool3d(2)
        self.back = L.PoolTranspose3d(2)
        self.wide = L.PoolTranspose3d(3, 2, 1)
        self.tri = L.TrilinearUpsample3d(2)
        self.tri3 = L.TrilinearUpsample3d((3, 1, 3))
        self.pool3 = L.MaxPool3d((3, 1, 3))

    def forward(self, x):
        p = self.pool(x)
        return self.back(p), self.wide(p, x), self.tri(p), self.tri(p, x), self.tri3(self.pool3(x))


class Features(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.rms = nn.RMSNorm(4, eps=None)
        self.rms_affine = nn.RMSNorm(4, eps=1e-6)
        self.exp, self.round = L.Elementwise("exp"), L.Elementwise("round")
        self.soft = nn.Softmax(dim=-1)
        self.fc = nn.Linear(4, 3)
        with torch.no_grad():
            self.rms_affine.weight.copy_(torch.linspace(0.5, 1.5, 4))

    def forward(self, x, ids):
        y = self.soft(self.exp(self.rms_affine(self.rms(x))))
        e = self.round(self.emb(ids) * 3.0)
        return y, self.fc(e)


def ids_input(n: int = 40) -> torch.Tensor:
    return torch.randint(0, 10, (n,))


MODELS = {
    "targets": (TargetConvs, lambda: (cloud(),)),
    "normalized": (Normalized, lambda: (cloud(),)),
    "upsample": (Upsample, lambda: (cloud(span=6),)),
    "features": (Features, lambda: (cloud(), ids_input())),
}


def ops_of(folder: Path) -> set[str]:
    return set(re.findall(r"= lattice\.([\w.]+) ", (folder / "graph.mlir").read_text()))


CASES = [(name, None, 32) for name in MODELS] + [
    (name, bits, group)
    for name in ("targets", "normalized", "features")
    for bits, group in ((8, 32), (4, 64))
]


@pytest.mark.parametrize("name,bits,group", CASES)
def test_eager_equals_reference(tmp_path: Path, name: str, bits: int | None, group: int) -> None:
    torch.manual_seed(hash((name, bits)) % 1000)
    factory, inputs = MODELS[name]
    model = factory().eval()
    report = L.save(model, tmp_path / name, inputs(), quantize_bits=bits, group_size=group)
    assert report.fresh == 2 and len(report.errors) == 3 * len(report.outputs)
    assert all(e.ok for e in report.errors), report.errors
    assert report.max_abs_error < 1e-4, report.errors
    text = (report.path / "graph.mlir").read_text()
    if bits is not None and name == "targets":
        assert f"#lattice.packing<int{bits}" in text
    if name == "normalized" and bits is not None:  # W² must be exact: normalized weights stay dense
        packing = dict(re.findall(r"lattice\.weight @(\w+) .*?packing = #lattice\.packing<(\w+)", text))
        assert packing.pop("down_weight") == f"int{bits}"
        assert set(packing.values()) == {"dense"}, packing
    print(name, bits, "max |eager - reference|:", report.max_abs_error)


def test_attribute_spelling(tmp_path: Path) -> None:
    """Attribute order as the dialect schema gives it (eps after accumulation only where it says)."""
    text = ""
    for name, (factory, inputs) in MODELS.items():
        text += (
            L.save(factory().eval(), tmp_path / name, inputs(), check=False).path / "graph.mlir"
        ).read_text()
    assert (
        "lattice.normalized_subm_conv3d %x, %a_weight, %a_bias {kernel_size = array<i64: 3, 3, 3>,"
        ' dilation = array<i64: 1, 1, 1>, eps = 0.00001 : f32, accumulation = "canonical_f32"}' in text
    )
    assert (
        "lattice.target_normalized_conv_transpose3d %down, %x, %onto_weight"
        " {kernel_size = array<i64: 3, 3, 3>, stride = array<i64: 2, 2, 2>, padding = array<i64: 1, 1, 1>,"
        " dilation = array<i64: 1, 1, 1>,"
        ' accumulation = "canonical_f32", eps = 0.00001 : f32}' in text
    )
    assert (
        "%gen = lattice.normalized_generative_conv_transpose3d %down, %gen_weight {kernel_size ="
        " array<i64: 2, 2, 2>, stride = array<i64: 2, 2, 2>, eps = 0.001 : f32,"
        ' accumulation = "canonical_f32"}' in text
    )
    assert "%onto = lattice.target_conv3d %x, %down, %onto_weight, %onto_bias {kernel_size" in text
    assert "%wide = lattice.pool_transpose3d %pool, %x {kernel_size = array<i64: 3, 3, 3>, stride" in text
    assert "%tri3 = lattice.trilinear_upsample3d %pool3 {stride = array<i64: 3, 1, 3>}" in text
    assert (
        "%emb = lattice.embedding_lookup %ids, %emb_weight  : (tensor<?xi64>, !lattice.weight<embedding"
        in text
    )
    assert "layout = #lattice.weight_layout<embedding_n_c>" in text
    assert "eps = 1.1920928955078125e-07 : f32" in text  # RMSNorm(eps=None): float32's eps
    assert '{kind = "exp"}' in text and '{kind = "round"}' in text and "{axis = 1}" in text


def test_all_31_ops_saved_loaded_and_run(tmp_path: Path) -> None:
    """Every dialect op, in artifacts that are saved, loaded and run by the reference executor."""
    import torch.nn.functional as F

    class Rest(nn.Module):  # the ops of the fixtures, in one small model
        def __init__(self) -> None:
            super().__init__()
            self.stem = L.SubmConv3d(4, 4, 3)
            self.bn, self.ln, self.act = L.BatchNorm(4), nn.LayerNorm(4), nn.GELU()
            self.pool, self.g, self.fc = L.MaxPool3d(2), L.GlobalAvgPool(2), nn.Linear(4, 2)
            self.down, self.up = L.Conv3d(4, 4, 2, stride=2), L.ConvTranspose3d(4, 4, 2, stride=2)
            self.gen = L.GenerativeConvTranspose3d(4, 4, 2, stride=2)

        def forward(self, points, feats, batch, active):
            x = L.voxelize(points, feats, batch, active, voxel_size=0.25, origin=-1.0)
            y = self.act(self.ln(self.bn(self.stem(x))))
            z = L.reindex_sparse(L.cat([y, x]), x)
            out = L.devoxelize(points, z + z, batch, active, voxel_size=0.25, origin=-1.0)
            d = self.down(y)
            return out, self.fc(self.g(self.pool(y))), F.silu(out), self.up(d), self.gen(d)

    pts = torch.rand(120, 3) * 2 - 1
    rest = (pts, torch.randn(120, 4), torch.randint(0, 2, (120,), dtype=torch.int32), torch.tensor([100]))
    seen: set[str] = set()
    runs = [(Rest, lambda: rest), *MODELS.values()]
    for i, (factory, inputs) in enumerate(runs):
        model, example = factory().eval(), inputs()
        report = L.save(model, tmp_path / f"m{i}", example, batch_size=2, check=False)
        with torch.no_grad():
            eager = model(*example)
        ran = L.run(L.load(report.path), example)
        errors = verify.compare(report.outputs, list(eager), ran, None)  # sorted rows
        assert all(e.ok for e in errors), errors
        seen |= ops_of(report.path)
    assert seen == ALL_OPS, (sorted(ALL_OPS - seen), sorted(seen - ALL_OPS))
