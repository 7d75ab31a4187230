"""Pictures that scale: grouped by module, drawn with or without Graphviz, shapes on every edge."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.test_cli import cli, cli_json
from torchlower.cli import op_families


def no_dot_json(*args: object) -> dict:
    """``torchlower ... --json`` with a PATH that holds no Graphviz."""
    proc = cli(*args, "--json", PATH="/nonexistent")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer transformer encoder with a dynamic sequence length S."""
    path = tmp_path_factory.mktemp("pic") / "enc.nnef.tgz"
    cli_json("export", "tests.cli_models:encoder2", "-o", path, "--input", "x:1x6x16", "--dynamic", "x:1=S")
    return path


def _nodes(root: ET.Element, kind: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == kind]


def test_grouped_picture_without_graphviz(encoder: Path, tmp_path: Path) -> None:
    """No `dot` on PATH: the Python layout draws one cluster per layer, blocks with op counts."""
    out = tmp_path / "enc.svg"
    data = no_dot_json("inspect", encoder, "--svg", out)
    pic = data["picture"]
    assert pic["renderer"] == "python" and pic["clusters"] == 2
    root = ET.parse(out).getroot()  # well-formed XML
    clusters = [g.find(f"{SVG}text").text for g in _nodes(root, "cluster")]
    assert clusters == ["layers.0", "layers.1"]
    nodes = _nodes(root, "node")
    assert len(nodes) == pic["nodes"] and pic["nodes"] < data["op_count"] / 4, "collapsed, not one per op"
    titles = [n.findall(f"{SVG}text")[0].text for n in nodes]
    for layer in ("layers.0", "layers.1"):
        assert f"{layer}.self_attn" in titles and f"{layer}.norm1" in titles
    attn = next(n for n in nodes if n.findall(f"{SVG}text")[0].text == "layers.0.self_attn")
    assert re.match(r"\d+ ops: ", attn.findall(f"{SVG}text")[1].text)
    assert "module layers.0.self_attn" in attn.find(f"{SVG}title").text
    labels = {t.text for g in _nodes(root, "edge") for t in g.iter(f"{SVG}text")}
    assert "1×S×16" in labels and "1×S×32" in labels, "symbolic shapes on the edges"
    legend = [g.find(f"{SVG}text").text for g in _nodes(root, "legend")]
    assert "attention" in legend and "normalization" in legend and "other" not in legend


def test_every_op_detail_without_graphviz(encoder: Path, tmp_path: Path) -> None:
    out = tmp_path / "ops.svg"
    data = no_dot_json("inspect", encoder, "--svg", out, "--detail", "ops")
    root = ET.parse(out).getroot()
    nodes = _nodes(root, "node")
    assert len(nodes) == data["op_count"] == data["picture"]["nodes"]
    tips = [n.find(f"{SVG}title").text for n in nodes]
    assert any(t.startswith("matmul(transposeA = False, transposeB = True)") for t in tips), tips[:5]
    assert any("module layers.1.linear2" in t for t in tips)


def test_inspect_counts_ops_per_module(encoder: Path) -> None:
    data = cli_json("inspect", encoder)
    modules = data["modules"]
    assert modules["layers.0.self_attn"] == modules["layers.1.self_attn"] > 10
    assert sum(modules.values()) <= data["op_count"]
    table = cli("inspect", encoder).stdout
    assert "layers.0 (" in table and "layers.1 (" in table


def test_grouped_picture_with_graphviz(encoder: Path, tmp_path: Path) -> None:
    source = tmp_path / "enc.dot"
    cli_json("inspect", encoder, "--dot", source)
    text = source.read_text()
    assert text.count("subgraph cluster_") == 2 and 'label="layers.0"' in text and 'label="layers.1"' in text
    if shutil.which("dot") is None:
        pytest.skip("Graphviz `dot` is not installed")
    out = tmp_path / "enc.svg"
    data = cli_json("inspect", encoder, "--svg", out)
    assert data["picture"]["renderer"] == "graphviz"
    drawn = out.read_text()
    assert drawn.count('class="cluster"') == 2 and ">layers.0.self_attn<" in drawn


def test_png_without_graphviz(encoder: Path, tmp_path: Path) -> None:
    """No `dot`: PNG is the same Python layout rasterized with Pillow, byte-identical when redrawn."""
    from PIL import Image

    first, again = tmp_path / "a.png", tmp_path / "b.png"
    pic = no_dot_json("inspect", encoder, "--png", first)["picture"]
    no_dot_json("inspect", encoder, "--png", again)
    assert pic["renderer"] == "python" and pic["format"] == "png"
    assert first.read_bytes() == again.read_bytes()
    image = Image.open(first)
    assert image.format == "PNG" and image.width > 200 and image.height > 400
    colours = {rgb for _, rgb in image.convert("RGB").getcolors(1 << 20)}
    for family in ("attention", "normalization"):
        hex_colour = op_families.color(family).lstrip("#")
        assert tuple(int(hex_colour[i : i + 2], 16) for i in (0, 2, 4)) in colours, family


def test_png_of_a_long_graph_is_scaled_to_open() -> None:
    from torchlower.cli import picture_png
    from torchlower.cli.picture_layout import Scene

    assert picture_png.scale_for(Scene(800, 600)) == 2.0
    tall = Scene(900, 400_000)
    k = picture_png.scale_for(tall)
    assert tall.height * k <= picture_png.MAX_SIDE
    assert tall.width * tall.height * k * k <= picture_png.MAX_PIXELS


TRACT_OPS = """
tract_core_argmax_reduce_last tract_core_argmin_reduce_last tract_core_bitand tract_core_bitnot
tract_core_bitor tract_core_bitxor tract_core_broadcast tract_core_cast tract_core_complex_to_inner_dim
tract_core_downsample tract_core_dyn_slice tract_core_einsum tract_core_einsum_q tract_core_erf
tract_core_external tract_core_fft tract_core_gather tract_core_gather_elements tract_core_gather_nd
tract_core_gelu_approx tract_core_grid_sample tract_core_gru_epilogue tract_core_hard_swish
tract_core_inner_dim_to_complex tract_core_is_inf tract_core_is_nan tract_core_log_softmax
tract_core_lstm_epilogue tract_core_matmul tract_core_one_hot tract_core_pow_const
tract_core_product_reduce tract_core_qconv tract_core_qmatmul tract_core_range tract_core_resize
tract_core_rms_norm tract_core_round_even tract_core_scan tract_core_scatter_elements
tract_core_scatter_nd tract_core_shape_of tract_core_silu tract_core_softmax tract_core_stft
tract_core_submodel tract_core_topk tract_core_trilu tract_core_xor tract_extra_exp_mean_norm
tract_extra_exp_unit_norm tract_transformers_apply_rope tract_transformers_causal_conv1d_update
tract_transformers_dyn_kv_cache tract_transformers_gdn_recurrent tract_transformers_gelu_approx
tract_transformers_quantized_dyn_kv_cache tract_transformers_quantized_kv_sdpa
tract_transformers_rms_norm tract_transformers_scaled_masked_softmax tract_transformers_sdpa
tract_transformers_silu tract_transformers_window_kv_sdpa
""".split()  # noqa: SIM905 (the registry list of tract's source, nnef/ transformers/ extra/)


def test_every_tract_and_standard_op_has_a_family() -> None:
    from torchlower.nnef.known_ops import STANDARD, TRACT_EXTRA

    unclassified = [op for op in [*TRACT_OPS, *STANDARD, *TRACT_EXTRA] if op_families.family(op) == "other"]
    assert unclassified == []
    assert op_families.family("tract_core_silu") == "activation"
    assert op_families.family("tract_transformers_sdpa") == "attention"
    assert op_families.family("variable<scalar>") == "weight"
