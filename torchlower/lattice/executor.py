"""Parse a lattice artifact and execute it with the brute-force ops of ``reference``.

The parser reads exactly what ``graph.mlir`` says (op, operands, attributes); the executor
interprets ops one by one on ``reference.Ref`` sparse values and plain tensors. Nothing here
uses the modules' fast path.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from torchlower.errors import ArtifactError, InvalidArgumentError
from torchlower.lattice import quantize
from torchlower.lattice import reference as R
from torchlower.lattice import reference_ops as RO
from torchlower.lattice.sparse import SparseTensor


@dataclass(frozen=True)
class Op:
    results: list[str]
    op: str
    operands: list[str]
    attrs: dict[str, Any]
    symbol: str | None = None  # @name of lattice.weight


@dataclass
class Artifact:
    """A parsed artifact: ABI names / roles, the op list and float32 weights by storage key."""

    input_names: list[str]
    input_roles: list[str]
    output_names: list[str]
    output_roles: list[str]
    ops: list[Op]
    returns: list[str]
    weights: dict[str, torch.Tensor] = field(default_factory=dict)


_LIST = r"\[(.*?)\]"


def parse_artifact(text: str, tensors: dict[str, torch.Tensor]) -> Artifact:
    def names(attr: str) -> list[str]:
        m = re.search(rf"lattice\.{attr} = {_LIST}", text)
        if m is None:
            raise ArtifactError(f"graph.mlir has no lattice.{attr}")
        return re.findall(r'"([^"]*)"', m.group(1))

    if "lattice.ir_version = 2," not in text:
        raise ArtifactError("graph.mlir is not lattice IR v2")
    ops = [parse_op(line.strip()) for line in text.splitlines() if re.match(r"\s+%\S.* = lattice\.", line)]
    ret = re.search(r"^\s+return (.*?) :", text, re.M)
    if ret is None:
        raise ArtifactError("graph.mlir has no return")
    art = Artifact(
        names("input_names"),
        names("input_roles"),
        names("output_names"),
        names("output_roles"),
        ops,
        [r.strip().lstrip("%") for r in ret.group(1).split(",")],
    )
    validate(art)
    for op in ops:
        if op.op == "weight":
            art.weights[op.attrs["storage_key"]] = _weight(op, ops, tensors)
    return art


OPS = frozenset(
    {
        *("weight", "sparse.make", "sparse.decompose", "sparse.with_features", "sparse.reindex"),
        *("conv3d", "subm_conv3d", "normalized_subm_conv3d", "target_conv3d", "conv_transpose3d"),
        *("target_conv_transpose3d", "normalized_conv_transpose3d", "target_normalized_conv_transpose3d"),
        *("generative_conv_transpose3d", "normalized_generative_conv_transpose3d", "pool3d"),
        *("pool_transpose3d", "trilinear_upsample3d", "global_pool", "voxelize", "devoxelize", "linear"),
        *("embedding_lookup", "elementwise", "softmax", "activation", "batch_norm", "layer_norm"),
        *("rms_norm", "sparse.binary", "sparse.cat"),
    }
)
TRIPLES = ("kernel_size", "stride", "padding", "dilation", "voxel_size", "origin")


def validate(art: Artifact) -> None:
    """Known ops, names defined before use, 3-vectors where the IR wants them, sizes in range."""
    unknown = sorted({o.op for o in art.ops} - OPS)
    if unknown:
        raise ArtifactError(f"unknown lattice ops {unknown} (lattice IR v2 has {len(OPS)} ops)")
    defined = set(art.input_names)
    for op in art.ops:
        missing = [o for o in op.operands if o not in defined]
        if missing:
            raise ArtifactError(f"lattice.{op.op} (%{op.results[0]}) uses undefined values {missing}")
        for key in TRIPLES:
            if key in op.attrs and (not isinstance(op.attrs[key], list) or len(op.attrs[key]) != 3):
                raise ArtifactError(f"lattice.{op.op} (%{op.results[0]}): {key} must have 3 entries")
        for key in ("kernel_size", "stride", "dilation"):
            if key in op.attrs and not all(1 <= int(v) <= 64 for v in op.attrs[key]):
                raise ArtifactError(
                    f"lattice.{op.op} (%{op.results[0]}): {key} {op.attrs[key]} outside 1..64"
                )
        defined.update(op.results)
    undefined = [r for r in art.returns if r not in defined]
    if undefined:
        raise ArtifactError(f"return uses undefined values {undefined}")
    if len(art.returns) != len(art.output_names):
        raise ArtifactError(f"{len(art.returns)} returned values for {len(art.output_names)} output names")


def _weight(op: Op, ops: list[Op], tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    key, packing = op.attrs["storage_key"], op.attrs["packing"]
    if packing == "dense":
        if key not in tensors:
            raise ArtifactError(f"weight {key} is not in the safetensors file")
        return tensors[key].float()
    bits = int(re.match(r"int(\d+)", packing).group(1))  # type: ignore[union-attr]
    parts = {n: tensors[f"{key}.{n}"] for n in ("weight", "scales", "biases")}
    user = next(o for o in ops if op.results[0] in o.operands)
    packed = parts["weight"]
    kernel = user.attrs.get("kernel_size")
    linear = kernel is None or math.prod(kernel) == 1
    out_ch = packed.shape[1] if linear else packed.shape[2]
    in_pad = (packed.shape[2] if linear else packed.shape[1]) * 32 // bits
    shape = (out_ch, in_pad) if kernel is None else (out_ch, *kernel, in_pad)
    return quantize.unpack(parts, shape, "linear" if kernel is None else "conv3d", bits)


def parse_op(line: str) -> Op:
    lhs, rhs = line.split(" = lattice.", 1)
    results = [r.strip().lstrip("%") for r in lhs.split(",")]
    op, _, rest = rhs.partition(" ")
    symbol = None
    if rest.startswith("@"):
        symbol, _, rest = rest.partition(" ")
    m = re.match(r"((?:%\w+(?:, )?)*)\s*", rest)
    operands = [o.strip().lstrip("%") for o in m.group(1).split(",") if o.strip()]  # type: ignore[union-attr]
    rest = rest[m.end() :]  # type: ignore[union-attr]
    attrs: dict[str, Any] = {}
    if rest.startswith("{"):
        depth = 0
        for i, ch in enumerate(rest):
            depth += (ch in "{<[(" and 1) or (-1 if ch in "}>])" else 0)
            if depth == 0:
                attrs = dict(_attr(item) for item in split_ops(rest[1:i]))
                break
    return Op(results, op, operands, attrs, symbol)


def split_ops(body: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += 1 if ch in "<[({" else -1 if ch in ">])}" else 0
        if ch == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    return [*items, body[start:].strip()] if body.strip() else items


def _attr(item: str) -> tuple[str, Any]:
    key, _, value = item.partition(" = ")
    if value.startswith("array<f64:"):
        return key, [float(v) for v in value[10:-1].split(",")]
    if value.startswith("array<i64:"):
        return key, [int(v) for v in value[10:-1].split(",")]
    if value.startswith("#lattice."):
        return key, value[value.index("<") + 1 : -1]
    if value.endswith(" : f32"):
        return key, float(value[: -len(" : f32")])
    if value.startswith('"'):
        return key, value[1:-1]
    return key, int(value)


# ---- execution --------------------------------------------------------------------------------
def _activation(x: torch.Tensor, a: dict[str, Any]) -> torch.Tensor:
    kind = a["kind"]
    if kind == "relu":
        return x.clamp(min=0)
    if kind == "leaky_relu":
        return torch.where(x >= 0, x, x * a["alpha"])
    if kind == "silu":
        return x / (1 + torch.exp(-x))
    if kind == "sigmoid":
        return 1 / (1 + torch.exp(-x))
    if kind == "tanh":
        return torch.tanh(x)
    if kind == "softplus":
        beta = a["beta"]
        return torch.where(x * beta > a["threshold"], x, torch.log1p(torch.exp(x * beta)) / beta)
    if kind == "gelu" and a["approximate"] == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if kind == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    raise ArtifactError(f"unknown activation {kind!r}")


def _elementwise(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "exp":
        return torch.exp(x)
    if kind == "round":
        return torch.round(x)  # half to even
    raise ArtifactError(f"unknown elementwise kind {kind!r} (the consumer accepts exp, round)")


_EXTRA_CONVS = (
    "target_conv3d",
    "target_conv_transpose3d",
    "normalized_subm_conv3d",
    "normalized_conv_transpose3d",
    "target_normalized_conv_transpose3d",
    "normalized_generative_conv_transpose3d",
)


def _extra_conv(k: str, a: dict[str, Any], args: list[Any]) -> R.Ref:
    """Target and normalized convs: operands ``x, [target], weight, [bias]``."""
    x = args[0]
    target = args[1] if k.startswith("target_") else None
    rest = args[2:] if target is not None else args[1:]
    weight, bias = rest[0][..., : x.channels], rest[1] if len(rest) > 1 else None
    kernel, dilation = a["kernel_size"], a.get("dilation", [1, 1, 1])
    stride, padding = a.get("stride", [1, 1, 1]), a.get("padding", [0, 0, 0])
    if k == "target_conv3d":
        return RO.target_conv(x, target, weight, bias, kernel, stride, padding, dilation)
    if k == "target_conv_transpose3d":
        return RO.target_conv_transpose(x, target, weight, bias, kernel, stride, padding, dilation)

    def run(ref: R.Ref, w: torch.Tensor, b: torch.Tensor | None) -> R.Ref:
        if k == "normalized_subm_conv3d":
            return R.subm_conv(ref, w, b, kernel, dilation)
        if k == "normalized_generative_conv_transpose3d":
            return R.generative_conv_transpose(ref, w, b, kernel, stride)
        if target is not None:
            return RO.target_conv_transpose(ref, target, w, b, kernel, stride, padding, dilation)
        return R.conv_transpose(ref, w, b, kernel, stride, padding, dilation)

    pointwise = list(kernel) == [1, 1, 1] and list(stride) == [1, 1, 1] and list(padding) == [0, 0, 0]
    pointwise = pointwise and list(dilation) == [1, 1, 1]
    return RO.normalized(run, x, weight, bias, a["eps"], pointwise)


def _make(coords: torch.Tensor, feats: torch.Tensor, active: torch.Tensor, a: dict[str, Any]) -> R.Ref:
    n, stride = int(active.reshape(-1)[0]), tuple(a["stride"])
    if (coords[:n, 1:] % torch.tensor(stride, dtype=coords.dtype) != 0).any():
        raise InvalidArgumentError(f"sparse input coordinates must be divisible by the stride {stride}")
    return R.Ref.of(coords[:n], feats[:n].float(), stride)  # type: ignore[arg-type]


def execute(art: Artifact, flat_inputs: list[torch.Tensor]) -> list[Any]:
    """Run ``art`` on its ABI inputs (one tensor per input name, in order)."""
    if len(flat_inputs) != len(art.input_names):
        raise InvalidArgumentError(
            f"the artifact takes {len(art.input_names)} inputs, got {len(flat_inputs)}"
        )
    env: dict[str, Any] = dict(zip(art.input_names, flat_inputs, strict=True))
    for op in art.ops:
        try:
            results = _step(art, op, [env[o] for o in op.operands])
        except (IndexError, KeyError, ValueError, TypeError, RuntimeError) as exc:  # malformed graph
            raise ArtifactError(
                f"lattice.{op.op} (%{op.results[0]}) cannot run: {type(exc).__name__}: {exc}"
            ) from None
        env.update(zip(op.results, results, strict=True))
    outs: list[Any] = []
    for name in art.returns:
        value = env[name]
        if isinstance(value, R.Ref):
            coords, feats = value.sorted()
            value = SparseTensor(feats, coords, value.stride, check=False)
        outs.append(value)
    return outs


def _step(art: Artifact, op: Op, args: list[Any]) -> list[Any]:
    a, k = op.attrs, op.op
    if k == "weight":
        return [art.weights[a["storage_key"]]]
    if k == "sparse.make":
        return [_make(*args, a)]
    if k == "voxelize":
        p, f, b, n = args
        return [
            R.voxelize(p, f.float(), b, int(n.reshape(-1)[0]), a["voxel_size"], a["origin"], a["reduction"])
        ]
    if k == "devoxelize":
        p, x, b, n = args
        return [
            R.devoxelize(p, x, b, int(n.reshape(-1)[0]), a["voxel_size"], a["origin"], a["interpolation"])
        ]
    if k in ("subm_conv3d", "conv3d", "conv_transpose3d", "generative_conv_transpose3d"):
        x, w, bias = args[0], args[1][..., : args[0].channels], args[2] if len(args) > 2 else None
        if k == "subm_conv3d":
            return [R.subm_conv(x, w, bias, a["kernel_size"], a["dilation"])]
        if k == "generative_conv_transpose3d":
            return [R.generative_conv_transpose(x, w, bias, a["kernel_size"], a["stride"])]
        fn = R.conv if k == "conv3d" else R.conv_transpose
        return [fn(x, w, bias, a["kernel_size"], a["stride"], a["padding"], a["dilation"])]
    if k in _EXTRA_CONVS:
        return [_extra_conv(k, a, args)]
    if k == "pool_transpose3d":
        target = args[1] if len(args) > 1 else None
        return [
            RO.pool_transpose(args[0], target, a["kernel_size"], a["stride"], a["padding"], a["dilation"])
        ]
    if k == "trilinear_upsample3d":
        return [RO.trilinear_upsample(args[0], args[1] if len(args) > 1 else None, a["stride"])]
    if k == "embedding_lookup":
        ids, table = args
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
            raise InvalidArgumentError(
                f"embedding ids must lie in [0, {table.shape[0]}); got {ids.min()}..{ids.max()}"
            )
        return [table[ids.long()]]
    if k == "pool3d":
        return [R.pool(args[0], a["mode"], a["kernel_size"], a["stride"], a["padding"], a["dilation"])]
    if k == "global_pool":
        return [R.global_pool(args[0], a["mode"], a["batch_size"])]
    if k == "sparse.decompose":
        coords, feats = args[0].sorted()
        return [coords, feats, torch.tensor([len(coords)], dtype=torch.int32)]
    if k == "sparse.with_features":
        x, feats = args
        keys = sorted(x.voxels)
        return [x.derive(dict(zip(keys, feats, strict=True)), x.stride, int(feats.shape[1]))]
    if k == "batch_norm":
        f, w, b, mean, var = args
        return [(f - mean) / torch.sqrt(var + a["eps"]) * w + b]
    if k == "layer_norm":
        f, w, b = args
        mean = f.mean(dim=1, keepdim=True)
        var = ((f - mean) ** 2).mean(dim=1, keepdim=True)
        return [(f - mean) / torch.sqrt(var + a["eps"]) * w + b]
    if k == "linear":
        f, w = args[0], args[1][:, : args[0].shape[1]]
        return [f @ w.t() + (args[2] if len(args) > 2 else 0)]
    if k == "activation":
        return [_activation(args[0], a)]
    if k == "elementwise":
        return [_elementwise(args[0], a["kind"])]
    if k == "softmax":
        f = args[0].double()
        shifted = f - f.max(dim=a["axis"], keepdim=True).values
        e = torch.exp(shifted)
        return [(e / e.sum(dim=a["axis"], keepdim=True)).to(args[0].dtype)]
    if k == "rms_norm":
        f, w = args
        return [f / torch.sqrt((f * f).mean(dim=1, keepdim=True) + a["eps"]) * w]
    if k == "sparse.binary":
        return [R.binary(a["op"], args[0], args[1], a["join"], a["lhs_fill"], a["rhs_fill"])]
    if k == "sparse.cat":
        return [R.cat(args, a["join"])]
    if k == "sparse.reindex":
        return [R.reindex(args[0], args[1], a["fill"])]
    raise ArtifactError(f"the reference executor does not know lattice.{k}")
