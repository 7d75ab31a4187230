"""Layout rules (slice/select/narrow, expand, repeat/tile, roll, flip, split family, stack,
movedim, unflatten, pixel shuffle) run in tract and compared with PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import Fn, export_and_check


def check(fn: Callable[..., object], tmp_path, frontend, *args: torch.Tensor):
    return export_and_check(Fn(fn), args, tmp_path, frontend)


X = (3, 5, 7)

SLICES = {
    "neg_start_to_end": lambda x: x[:, -3:],
    "step": lambda x: x[:, 1::2, ::3],
    "neg_stop": lambda x: x[..., 1:-2],
    "select_neg": lambda x: x[-1, :, 2],
    "select_mid": lambda x: x[:, 2],
    "over_end": lambda x: x[:, 2:100],
    "narrow": lambda x: x.narrow(2, 2, 3),
    "narrow_neg": lambda x: x.narrow(-1, -4, 2),
    "select_dim": lambda x: x.select(-2, -2),
}


@pytest.mark.parametrize("case", SLICES)
def test_slice_select(tmp_path, frontend, case):
    report = check(lambda x: SLICES[case](x), tmp_path, frontend, torch.randn(*X))
    assert report.op_histogram["slice"] >= 1


EXPANDS = {
    "expand": lambda x: x[:, :1].expand(3, 4, 7),
    "expand_neg1_new_dims": lambda x: x[:1].expand(2, -1, -1, -1),
    "expand_as": lambda x: x[:, :, :1].expand_as(x),
    "repeat": lambda x: x.repeat(2, 1, 3),
    "repeat_more_dims": lambda x: x.repeat(2, 1, 1, 2),
    "tile_short": lambda x: torch.tile(x, (2,)),
    "tile_long": lambda x: torch.tile(x, (2, 1, 1, 1)),
}


@pytest.mark.parametrize("case", EXPANDS)
def test_expand_repeat(tmp_path, frontend, case):
    report = check(lambda x: EXPANDS[case](x), tmp_path, frontend, torch.randn(*X))
    assert sum(report.op_histogram[k] for k in ("tile", "tract_core_broadcast")) == 1


def test_expand_writes_no_full_size_weight(tmp_path, frontend):
    report = check(lambda x: x[:, :1].expand(3, 5, 7), tmp_path, frontend, torch.randn(*X))
    assert report.weight_bytes == 0


ROLLS = {
    "no_dim": lambda x: torch.roll(x, 4),
    "no_dim_neg": lambda x: torch.roll(x, -9),
    "one_dim_neg": lambda x: torch.roll(x, -2, 1),
    "several": lambda x: torch.roll(x, (1, -3, 9), (0, -1, 1)),
    "full_turn": lambda x: torch.roll(x, 7, 2),
}


@pytest.mark.parametrize("case", ROLLS)
def test_roll(tmp_path, frontend, case):
    check(lambda x: ROLLS[case](x), tmp_path, frontend, torch.randn(*X))


@pytest.mark.parametrize("dims", [(0,), (-1,), (0, 2), (1, -1)])
def test_flip(tmp_path, frontend, dims):
    check(lambda x: x.flip(dims), tmp_path, frontend, torch.randn(*X))


SPLITS = {
    "split_even": lambda x: x.split(1, 0),
    "split_uneven": lambda x: x.split(3, 2),
    "split_sizes": lambda x: x.split([1, 4, 2], -1),
    "chunk_uneven": lambda x: x.chunk(3, 1),
    "chunk_fewer": lambda x: x.chunk(4, 0),
    "unbind": lambda x: x.unbind(1),
    "unbind_neg": lambda x: torch.unbind(x, -1),
}


@pytest.mark.parametrize("case", SPLITS)
def test_split_family(tmp_path, frontend, case):
    def fn(x):
        return tuple(SPLITS[case](x))

    report = check(fn, tmp_path, frontend, torch.randn(*X))
    assert len(report.outputs) == len(SPLITS[case](torch.randn(*X)))


@pytest.mark.parametrize("dim", [0, 1, 3, -1, -2, -4])
def test_stack(tmp_path, frontend, dim):
    check(lambda x, y: torch.stack([x, y, x], dim), tmp_path, frontend, torch.randn(*X), torch.randn(*X))


MOVES = {
    "movedim": lambda x: x.movedim(0, -1),
    "movedim_neg": lambda x: torch.movedim(x, -1, 0),
    "movedim_list": lambda x: x.movedim((0, 1), (2, 0)),
    "moveaxis": lambda x: torch.moveaxis(x, 1, 2),
    "unflatten": lambda x: x.unflatten(2, (1, 7)),
    "unflatten_neg": lambda x: x.unflatten(-1, (7, -1)).unflatten(1, (1, 5)),
}


@pytest.mark.parametrize("case", MOVES)
def test_movedim_unflatten(tmp_path, frontend, case):
    check(lambda x: MOVES[case](x), tmp_path, frontend, torch.randn(*X))


@pytest.mark.parametrize("shape", [(2, 12, 3, 4), (1, 2, 8, 5, 5)])
def test_pixel_shuffle(tmp_path, frontend, shape):
    check(lambda x: F.pixel_shuffle(x, 2), tmp_path, frontend, torch.randn(*shape))


@pytest.mark.parametrize(("shape", "factor"), [((2, 3, 4, 6), 2), ((1, 2, 2, 6, 3), 3)])
def test_pixel_unshuffle(tmp_path, frontend, shape, factor):
    check(lambda x: F.pixel_unshuffle(x, factor), tmp_path, frontend, torch.randn(*shape))
