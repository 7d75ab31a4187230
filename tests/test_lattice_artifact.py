"""Lattice artifacts: byte-for-byte fixtures, reference executor vs eager, quantization, errors."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from torchlower import lattice as L
from torchlower.errors import InvalidArgumentError, LoweringError, UnsupportedOpsError
from torchlower.lattice import quantize

pytest.importorskip("torchlower.fx", reason="lattice.save lowers through the FX front end (issue 3)")

FIXTURES = Path("/work/shared/fixtures/lattice")
VOXEL = dict(voxel_size=0.1, origin=(-1, -1, -1))


class DenseFixture(nn.Module):
    """The ``dense/`` model of the fixtures README."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = L.SubmConv3d(4, 8, 3, bias=True)
        self.bn = L.BatchNorm(8, eps=1e-5)
        self.act = nn.ReLU()
        self.down = L.Conv3d(8, 16, 2, stride=2)
        self.pool = L.MaxPool3d(2, 2)
        self.up = L.ConvTranspose3d(16, 8, 2, stride=2)
        self.gen = L.GenerativeConvTranspose3d(16, 8, 2, stride=2)
        self.ln = nn.LayerNorm(16)
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, points, feats, batch_indices, active_rows):
        x = L.voxelize(points, feats, batch_indices, active_rows, reduction="mean", **VOXEL)
        x = self.act(self.bn(self.stem(x)))
        d = self.down(x)
        u = self.up(d)
        y = u + x
        z = self.gelu(L.cat([y, x]))
        p = self.pool(d)
        g = self.gen(d)
        m = L.mul(g, y)
        out = L.devoxelize(points, z, batch_indices, active_rows, interpolation="linear", **VOXEL)
        return out, p, m


class HeadFixture(nn.Module):
    """The ``head/`` model of the fixtures README."""

    def __init__(self) -> None:
        super().__init__()
        self.c = L.SubmConv3d(3, 8, 3)
        self.bn = L.BatchNorm(8)
        self.r = nn.ReLU()
        self.g = L.GlobalAvgPool()
        self.fc = nn.Linear(8, 5)
        self.sp = nn.Softplus(beta=2, threshold=10)

    def forward(self, x):
        return self.sp(self.fc(self.g(self.r(self.bn(self.c(x))))))


def points(n: int = 400, batches: int = 2) -> tuple[torch.Tensor, ...]:
    pts = torch.rand(n, 3) * 1.6 - 0.8
    return (
        pts,
        torch.randn(n, 4),
        torch.randint(0, batches, (n,), dtype=torch.int32),
        torch.tensor([n - 20], dtype=torch.int32),
    )


def sparse_input(n: int = 120, channels: int = 3, stride: int = 2, batches: int = 2) -> L.SparseTensor:
    coords = torch.cat([torch.randint(0, batches, (n, 1)), torch.randint(-5, 5, (n, 3)) * stride], dim=1)
    coords = torch.unique(coords, dim=0)
    return L.SparseTensor(torch.randn(len(coords), channels), coords.int(), stride)


def sort_rows(x: L.SparseTensor) -> tuple[torch.Tensor, torch.Tensor]:
    keys = sorted(range(len(x.coords)), key=lambda i: tuple(x.coords[i].tolist()))
    return x.coords[keys], x.feats[keys]


def compare(eager: object, reference: object) -> float:
    """Max abs error, after sorting sparse rows (the coordinates must match exactly)."""
    if isinstance(eager, L.SparseTensor):
        (ce, fe), (cr, fr) = sort_rows(eager), sort_rows(reference)  # type: ignore[arg-type]
        assert torch.equal(ce, cr) and eager.stride == reference.stride  # type: ignore[union-attr]
        eager, reference = fe, fr
    assert eager.shape == reference.shape  # type: ignore[union-attr]
    return float((eager - reference).abs().max()) if eager.numel() else 0.0  # type: ignore[union-attr]


def check_reference(model: nn.Module, folder: Path, inputs: tuple, tol: float = 1e-4) -> list[float]:
    with torch.no_grad():
        eager = model(*inputs)
    eager = list(eager) if isinstance(eager, tuple) else [eager]
    ran = L.run(L.load(folder), inputs)
    errors = [compare(e, r) for e, r in zip(eager, ran, strict=True)]
    assert max(errors) < tol, errors
    return errors


def dequantized(model: nn.Module, bits: int, group: int, scale_dtype: str) -> nn.Module:
    """The model with every conv / linear weight replaced by its quantize → dequantize image."""
    copy_ = copy.deepcopy(model)
    for m in copy_.modules():
        kind = (
            "linear" if isinstance(m, nn.Linear) else "conv3d" if isinstance(m, L.modules.ConvBase) else None
        )
        if kind:
            w = m.weight.data
            m.weight.data = quantize.unpack(
                quantize.pack(w, kind, bits, group, scale_dtype), tuple(w.shape), kind, bits
            )
    return copy_


def fixture_weights(name: str, model: nn.Module) -> nn.Module:
    """Load the fixture's own weights into ``model`` (packed ones dequantized), so the artifact
    saved from it can be compared with the fixture byte for byte, weights included."""
    from safetensors.torch import load_file

    stored = load_file(FIXTURES / name / "weights.safetensors")
    state = {k: v for k, v in stored.items() if not k.endswith((".weight.weight", ".scales", ".biases"))}
    for key in {k.rsplit(".", 1)[0] for k in stored if k.endswith(".scales")}:
        want = model.get_parameter(key).shape
        kind = "linear" if len(want) == 2 else "conv3d"
        parts = {n: stored[f"{key}.{n}"] for n in ("weight", "scales", "biases")}
        padded = (*want[:-1], parts["weight"].shape[-1] * 4)  # int8: 4 codes per uint32 word
        state[key] = quantize.unpack(parts, padded, kind, 8)[..., : want[-1]]
    model.load_state_dict(state, strict=False)
    return model.eval()


def assert_fixture_bytes(folder: Path, name: str) -> None:
    for file in ("graph.mlir", "weights.safetensors"):
        assert (folder / file).read_bytes() == (FIXTURES / name / file).read_bytes(), file


def test_dense_fixture_bytes_and_reference(tmp_path: Path) -> None:
    model = fixture_weights("dense", DenseFixture())
    inputs = points()
    L.save(model, tmp_path / "dense", inputs, output_names=["point_feats", "pooled", "gated"])
    assert_fixture_bytes(tmp_path / "dense", "dense")
    errors = check_reference(model, tmp_path / "dense", inputs)
    print("dense reference-vs-eager max abs errors:", errors)


def test_head_fixture_bytes_and_quantized_reference(tmp_path: Path) -> None:
    model = fixture_weights("head", HeadFixture())
    x = sparse_input()
    L.save(model, tmp_path / "head", (x,), batch_size=2, quantize_bits=8, group_size=32, scale_dtype="f32")
    assert_fixture_bytes(tmp_path / "head", "head")
    from safetensors import safe_open

    with safe_open(tmp_path / "head/weights.safetensors", "pt") as got:
        assert got.metadata() == {"format": "torch"}
    model.g.batch_size = 2
    errors = check_reference(dequantized(model, 8, 32, "f32"), tmp_path / "head", (x,))
    print("head (int8) reference-vs-dequantized-eager max abs errors:", errors)


def test_cat_of_three_folds_pairwise(tmp_path: Path) -> None:
    """n inputs → n − 1 binary ``sparse.cat`` ops named ``<node>_<i>``; same numbers as eager."""

    class Three(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = L.SubmConv3d(3, 2), L.Conv3d(3, 3, 2, stride=2)
            self.up = L.GenerativeConvTranspose3d(3, 4, 2, stride=2)

        def forward(self, x):
            return L.cat([self.a(x), x, self.up(self.b(x))], join="outer")

    x = sparse_input(stride=1)
    model = Three().eval()
    folder = L.save(model, tmp_path / "three", (x,)).path
    text = (folder / "graph.mlir").read_text()
    assert "%cat_1 = lattice.sparse.cat %a, %x {join = #lattice.join<outer>}" in text
    assert "%cat_2 = lattice.sparse.cat %cat_1, %up {join = #lattice.join<outer>}" in text
    assert text.count("lattice.sparse.cat") == 2
    check_reference(model, folder, (x,))


class Wide(nn.Module):
    """Everything the fixtures do not cover: pools, joins with fills, reindex, feature modules."""

    def __init__(self) -> None:
        super().__init__()
        self.a = L.SubmConv3d(3, 6, (3, 1, 3), dilation=2)
        self.b = L.Conv3d(6, 6, 3, stride=2, padding=1)
        self.avg, self.sum = L.AvgPool3d(2), L.SumPool3d(3, 2, 1)
        self.lin = nn.Linear(6, 6)
        self.ln = nn.LayerNorm(6)
        self.acts = nn.ModuleList([nn.LeakyReLU(0.2), nn.SiLU(), nn.Sigmoid(), nn.Tanh(), nn.GELU()])
        self.gmax = L.GlobalMaxPool(2)

    def forward(self, x):
        y = self.ln(self.lin(self.a(x)))
        for act in self.acts:
            y = act(y)
        d = self.b(y)
        s = L.sub(self.avg(y), self.sum(y), "left", 0.5, -1.0)
        t = L.maximum(s, d, "outer", -2.0, 3.0)
        r = L.reindex_sparse(L.minimum(t, d), s, 0.25)
        return r, self.gmax(t), L.cat([s, d], join="outer")


@pytest.mark.parametrize("bits,group,scale", [(None, 32, "f16"), (4, 64, "f16"), (8, 128, "f32")])
def test_wide_model_reference(tmp_path: Path, bits: int | None, group: int, scale: str) -> None:
    model = Wide().eval()
    x = sparse_input(channels=3, stride=1, n=150)
    L.save(model, tmp_path / "wide", (x,), quantize_bits=bits, group_size=group, scale_dtype=scale)
    ref_model = dequantized(model, bits, group, scale) if bits else model
    errors = check_reference(ref_model, tmp_path / "wide", (x,), tol=1e-3)
    print(f"wide bits={bits}: reference-vs-eager max abs errors:", errors)


def test_typed_errors(tmp_path: Path) -> None:
    x = sparse_input()
    with pytest.raises(InvalidArgumentError, match="group_size"):
        L.save(HeadFixture().eval(), tmp_path / "h", (x,), batch_size=2, quantize_bits=8, group_size=16)
    with pytest.raises(LoweringError, match="batch size"):
        L.save(HeadFixture().eval(), tmp_path / "h", (x,))
    with pytest.raises(InvalidArgumentError, match="divisible"):
        L.SparseTensor(torch.zeros(1, 3), torch.tensor([[0, 1, 0, 0]]), 2)

    class Unsupported(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = L.SubmConv3d(3, 3)
            self.e, self.h, self.m = nn.ELU(), nn.Hardswish(), nn.Mish()

        def forward(self, x):
            return self.m(self.h(self.e(self.c(x))))

    with pytest.raises(UnsupportedOpsError) as err:
        L.save(Unsupported().eval(), tmp_path / "u", (x,))
    assert len(err.value.ops) == 3, err.value


def test_save_verifies_on_fresh_inputs_and_keeps_a_training_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = HeadFixture()  # training mode: an eval copy is lowered, the model stays as it is
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = sparse_input()
    with caplog.at_level("WARNING", logger="torchlower"):
        report = L.save(model, tmp_path / "h", (x,), batch_size=2, quantize_bits=4, group_size=32)
    assert "training mode" in caplog.text
    assert model.training and all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert report.fresh == 2 and [e.name for e in report.errors] == [
        "output",
        "output (random 1)",
        "output (random 2)",
    ]
    assert all(e.ok for e in report.errors) and report.max_abs_error < 1e-4, report.errors
    assert report.op_histogram["subm_conv3d"] == 1 and report.path == tmp_path / "h"
    assert not L.save(model, tmp_path / "h", (x,), batch_size=2, check=False).checked


def test_save_check_catches_a_wrong_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule that writes the wrong attribute must fail the check, not pass it."""
    from torchlower.errors import CheckError
    from torchlower.lattice import rule_base  # where the activation attributes are written

    real = rule_base.f32
    monkeypatch.setattr(rule_base, "f32", lambda v: real(v * 1.5) if v == 0.2 else real(v))

    class Leaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c, self.act = L.SubmConv3d(3, 4), nn.LeakyReLU(0.2)

        def forward(self, x):
            return self.act(self.c(x))

    with pytest.raises(CheckError, match="disagrees") as err:
        L.save(Leaky().eval(), tmp_path / "l", (sparse_input(),))
    assert err.value.errors and not all(e.ok for e in err.value.errors)


def test_lossless_float_attributes_and_atomic_write(tmp_path: Path) -> None:
    class Tiny(nn.Module):
        def __init__(self, slope: float) -> None:
            super().__init__()
            self.act = nn.LeakyReLU(slope)

        def forward(self, x):
            return self.act(x)

    x = sparse_input()
    folder = L.save(Tiny(1e-13).eval(), tmp_path / "tiny", (x,)).path
    text = (folder / "graph.mlir").read_text()
    assert "alpha = 1.0e-13 : f32" in text
    op = next(o for o in L.load(folder).ops if o.op == "activation")
    assert op.attrs["alpha"] == 1e-13
    before = (folder / "graph.mlir").read_bytes()
    with pytest.raises(InvalidArgumentError):
        L.save(Tiny(0.5).eval(), folder, (x,), quantize_bits=3)
    assert (folder / "graph.mlir").read_bytes() == before
    L.save(Tiny(0.5).eval(), folder, (x,))
    assert "alpha = 0.5 : f32" in (folder / "graph.mlir").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_reference_value_names(tmp_path: Path) -> None:
    """Module paths become value names as the reference writes them: ``0.weight`` → ``v_0_weight``;
    a model that is one module is named after its type; eval no-ops write nothing."""
    seq = nn.Sequential(
        L.SubmConv3d(3, 4), nn.ReLU(), nn.Dropout(0.3), L.GlobalAvgPool(2), nn.Flatten(), nn.Linear(4, 2)
    )
    x = sparse_input()
    text = (L.save(seq.eval(), tmp_path / "seq", (x,)).path / "graph.mlir").read_text()
    assert '%v_0_weight = lattice.weight @v_0_weight {storage_key = "0.weight"' in text
    assert "%v_0 = lattice.subm_conv3d %input, %v_0_weight" in text  # Sequential.forward(input)
    assert "%sparse_decompose, %v_1_features_in, %v_1_active = lattice.sparse.decompose %v_0" in text
    assert "%v_5 = lattice.linear %v_3, %v_5_weight, %v_5_bias" in text and "dropout" not in text
    one = L.save(L.SubmConv3d(3, 4, bias=True).eval(), tmp_path / "one", (x,))
    text = (one.path / "graph.mlir").read_text()
    assert '%submconv3d_weight = lattice.weight @submconv3d_weight {storage_key = "submconv3d.weight"' in text
    assert "%submconv3d = lattice.subm_conv3d %x, %submconv3d_weight, %submconv3d_bias" in text
    assert one.max_abs_error < 1e-4
