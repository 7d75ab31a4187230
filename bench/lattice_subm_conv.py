"""Benchmark (not a test): SubmConv3d 32→32, kernel 3, on ~100k active voxels, CPU, 2 threads.

Reports the kernel-map build time and the per-call time with the map cached (the usual case:
every layer on the same voxels shares one map). Run:
    PYTHONPATH=. python bench/lattice_subm_conv.py
"""

from __future__ import annotations

import time

import torch

from torchlower import lattice as L
from torchlower.lattice import kernels


def cloud(target: int = 100_000) -> L.SparseTensor:
    """A random surface-like cloud: points on two noisy spheres, voxelized at 2 cm."""
    g = torch.Generator().manual_seed(0)
    pts = torch.randn(4 * target, 3, generator=g)
    pts = pts / pts.norm(dim=1, keepdim=True) * (1 + 0.02 * torch.randn(4 * target, 1, generator=g))
    batch = torch.randint(0, 2, (4 * target,), generator=g, dtype=torch.int32)
    active = torch.tensor([4 * target], dtype=torch.int32)
    x = L.voxelize(pts, torch.randn(4 * target, 32, generator=g), batch, active, 0.03, -1.2)
    return x


def main() -> None:
    torch.set_num_threads(2)
    x = cloud()
    conv = L.SubmConv3d(32, 32, 3).eval()
    print(f"active voxels: {len(x.coords)}")
    t0 = time.perf_counter()
    for _ in range(3):
        kernels.subm_map(x.coords, x.stride, (3, 3, 3), (1, 1, 1))
    map_ms = (time.perf_counter() - t0) / 3 * 1e3
    with torch.no_grad():
        conv(x)  # builds and caches the map
        t0 = time.perf_counter()
        for _ in range(5):
            conv(x)
        call_ms = (time.perf_counter() - t0) / 5 * 1e3
        fresh = L.SparseTensor(x.feats, x.coords.clone(), check=False)
        t0 = time.perf_counter()
        conv(fresh)
        cold_ms = (time.perf_counter() - t0) * 1e3
    print(f"kernel map build: {map_ms:.1f} ms")
    print(f"SubmConv3d 32->32 k3, map cached: {call_ms:.1f} ms/call")
    print(f"SubmConv3d 32->32 k3, map built in the call: {cold_ms:.1f} ms")


if __name__ == "__main__":
    main()
