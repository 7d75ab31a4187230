"""Lattice rules of the normalized / target convolutions, pool transpose, trilinear upsampling,
embedding lookup, RMS norm and elementwise modules."""

from __future__ import annotations
