"""Layout chains (torchlower/nnef/layout.py): any chain of reshape / squeeze / unsqueeze /
transpose is rewritten to at most one transpose over the same elements in the same order.

The algebra is checked on random chains evaluated with NNEF semantics in torch (exact equality,
no tolerance: the pass only moves elements); the whole pass on attention models in tract.
"""

from __future__ import annotations

import random

import torch
from torch import nn

import torchlower
from torchlower.core.values import Value
from torchlower.nnef import layout, text
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.tract import run_in_tract


def _apply(a: text.Assignment, x: torch.Tensor) -> torch.Tensor:
    """NNEF semantics of the four layout ops, on a torch tensor."""
    if a.op == "transpose":
        axes = list(a.attrs["axes"])
        return x.permute(*axes, *range(len(axes), x.dim()))
    if a.op == "squeeze":
        return x.reshape([d for i, d in enumerate(x.shape) if i not in a.attrs["axes"]])
    if a.op == "unsqueeze":
        for ax in sorted(a.attrs["axes"]):
            x = x.unsqueeze(ax)
        return x
    return x.reshape(a.attrs["shape"])


def _factors(n: int, rng: random.Random) -> list[int]:
    """A random factorisation of ``n`` into dims, with a size-1 dim now and then."""
    out = []
    for p in (2, 3, 5):
        while n % p == 0:
            n //= p
            out.append(p)
    rng.shuffle(out)
    dims, cur = [], 1
    for f in out:
        cur *= f
        if rng.random() < 0.5:
            dims.append(cur)
            cur = 1
    dims.append(cur)
    if rng.random() < 0.3:
        dims.insert(rng.randrange(len(dims) + 1), 1)
    return dims


def _random_chain(rng: random.Random) -> tuple[Value, list[text.Assignment]]:
    shape = _factors(rng.choice([12, 24, 30, 36, 60]), rng)
    x = Value("x", torch.float32, tuple(shape))
    chain, cur = [], x
    for i in range(rng.randint(1, 5)):
        kind = rng.choice(["transpose", "transpose", "reshape", "squeeze", "unsqueeze"])
        s = list(cur.shape)
        if kind == "transpose":
            attrs = {"axes": rng.sample(range(len(s)), len(s))}
            new = [s[p] for p in attrs["axes"]]
        elif kind == "reshape":
            new = _factors(int(torch.tensor(s).prod()), rng)
            attrs = {"shape": new}
        elif kind == "squeeze" and 1 in s:
            attrs = {"axes": [s.index(1)]}
            new = s[: s.index(1)] + s[s.index(1) + 1 :]
        else:
            kind, ax = "unsqueeze", rng.randrange(len(s) + 1)
            attrs, new = {"axes": [ax]}, [*s[:ax], 1, *s[ax:]]
        out = Value(f"v{i}", torch.float32, tuple(new))
        chain.append(text.Assignment([out], kind, [cur], attrs))
        cur = out
    return x, chain


def test_random_chains_move_the_same_elements():
    rng, rewritten = random.Random(16), 0
    for _ in range(400):
        x, chain = _random_chain(rng)
        new = layout._rewrite_chain(NNEFBuilder(), chain)
        if new is None:
            continue
        rewritten += 1
        assert sum(a.op == "transpose" for a in new) <= 1 and len(new) <= 3
        assert new[-1].outputs[0] is chain[-1].outputs[0]
        data = torch.arange(float(torch.tensor(x.shape).prod())).reshape(x.shape)
        want, got = data, data
        for a in chain:
            want = _apply(a, want)
        for a in new:
            got = _apply(a, got)
            assert list(got.shape) == list(a.outputs[0].shape)
        assert torch.equal(got, want), (x.shape, [(a.op, a.attrs) for a in chain])
    assert rewritten >= 150  # most random chains are expressible as a permutation of atoms


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


def test_attention_head_split_needs_fewer_transposes(monkeypatch, tmp_path):
    """batch_first MultiheadAttention: the batch swaps of a size-1 batch become reshapes and the
    5-axis transpose after the packed projection a 3-axis one (one MoveAxis in tract, not three);
    tract gives the same outputs with and without, to float32 rounding."""
    model = SelfAttention().eval()
    for batch in (1, 2):
        x = torch.randn(batch, 10, 32)
        with monkeypatch.context() as m:
            m.setattr(layout, "canonical_layout", lambda b: False)
            plain = torchlower.export(model, x, tmp_path / f"plain{batch}.nnef.tar", check=False)
        canon = torchlower.export(model, x, tmp_path / f"canon{batch}.nnef.tar", check=False)
        fewer = plain.op_histogram["transpose"] - canon.op_histogram["transpose"]
        assert fewer == (2 if batch == 1 else 0)  # the batch swaps of a size-1 batch go
        fresh = torch.randn(batch, 10, 32, generator=torch.Generator().manual_seed(batch))
        a = run_in_tract(plain.path, [fresh.numpy()])[0]
        b = run_in_tract(canon.path, [fresh.numpy()])[0]
        # Not bit for bit by construction: the two graphs differ in more than data movement for
        # tract, which may fold the relayouts into its matmuls and block them differently (equal
        # on the machine this was written on). Both to float32 rounding of torch: outputs are
        # O(0.3), so 1e-5 is ~100 ulps for a chain of ~90 summed terms (in-projection 32 + bias,
        # q·k 8, softmax over 10, ·v 10, out-projection 32 + bias), while a misplaced axis moves
        # them by O(0.1).
        with torch.no_grad():
            want = model(fresh).numpy()
        assert abs(a - want).max() <= 1e-5 and abs(b - want).max() <= 1e-5
