"""Typed errors naming the user's path on damaged LLM archives, the sample check catching wrong
numbers, the context bound, and ``llm generate``'s usage errors (issue 31, "First, a bug"; the
every-command matrix is ``test_archive_kinds.py``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchlower
from tests.cli_inprocess import run
from tests.test_archive_kinds import _refused, _write_tar

pytest.importorskip("transformers")
from torchlower.errors import ArtifactError, CheckError, InvalidArgumentError
from torchlower.nnef import reader


@pytest.mark.xdist_group("llama")
def test_llm_sample_check_catches_wrong_numbers(exports: Any, tmp_path: Path) -> None:
    """A sample whose recorded logits are off fails the check, naming the sample and output."""
    bad = tmp_path / "bad.nnef.tar"
    _rewrite(exports.exported("llama").path, bad, "io/decode_step.npz", _shift_logits)
    with pytest.raises(CheckError, match=r"outputs \(io/decode_step\.npz\).*max abs") as err:
        torchlower.check(bad)
    assert str(bad) in str(err.value)
    ran = run("check", bad)
    assert ran.returncode == 1 and "io/decode_step.npz" in ran.stderr


@pytest.mark.xdist_group("llama")
def test_errors_name_the_users_path(exports: Any, tmp_path: Path) -> None:
    """A damaged bundled file or an unknown member: every command names the archive given, never
    the private folder the reader extracts to."""
    source = exports.exported("llama").path
    broken = tmp_path / "broken.nnef.tgz"
    _rewrite(source, broken, "config.json", lambda _b: b"{not json")
    stray = tmp_path / "stray.nnef.tgz"
    _rewrite(source, stray, "notes.txt", lambda _b: b"hello")
    for path, why in (
        (broken, "bundled 'config.json' is not JSON"),
        (stray, "unexpected member 'notes.txt'"),
    ):
        for command in ("inspect", "check", "run"):
            ran = run(command, path)
            _refused(ran, path, command)
            assert why in ran.stderr, (command, ran.stderr)
        with pytest.raises(ArtifactError, match=str(path)):
            torchlower.check(path)
    unpacked = tmp_path / "unpacked.nnef"  # a folder with a file the reader reads by member name
    unpacked.mkdir()
    for name, blob in reader.read_members(source).items():
        (unpacked / name).parent.mkdir(parents=True, exist_ok=True)
        (unpacked / name).write_bytes(blob)
    (unpacked / "io" / "x.npz").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: no arrays
    assert torchlower.inspect(unpacked, tract=False)["bundled"]["samples"]["io/x.npz"] == {}
    (unpacked / "io" / "x.npz").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match=rf"{unpacked}: bundled 'io/x.npz' is not a readable \.npz"):
        torchlower.load(unpacked)


@pytest.mark.xdist_group("llama")
def test_one_position_past_the_context_is_refused(exports: Any) -> None:
    """P + S = max_context runs; one more is a typed refusal from run and check (tract itself
    would read past the position table and abort)."""
    path = exports.exported("llama").path
    art = torchlower.load(path)
    ids = np.zeros((1, 1), dtype=np.int64)

    def caches(p: int) -> list[np.ndarray]:
        return [np.zeros((1, 2, p, 8), np.float32) for _ in range(4)]

    with art:
        assert np.isfinite(art.run([ids, *caches(127)])["outputs"]).all()
        with pytest.raises(InvalidArgumentError, match=r"P \+ S = 129 .*bound P \+ S <= 128"):
            art.run([ids, *caches(128)])
    with pytest.raises(InvalidArgumentError, match=str(path)):
        torchlower.check(path, [ids, *caches(128)])


def _shift_logits(blob: bytes) -> bytes:
    with np.load(io.BytesIO(blob)) as data:
        arrays = {k: data[k] for k in data}
    arrays["outputs"] = arrays["outputs"] + 1.0
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _rewrite(source: Path, target: Path, member: str, change: Any) -> None:
    """``source`` (tar / tgz / folder) as a tar or tgz at ``target`` with ``member`` changed (or added)."""
    files = dict(reader.read_members(source))
    files[member] = change(files.get(member, b""))
    _write_tar(target, files)


def test_generate_usage_errors(tmp_path: Path) -> None:
    """``llm generate``'s own options are refused before anything loads (exit 2, the fix named)."""
    target = tmp_path / "m.nnef.tgz"
    target.write_bytes(b"")
    np.savez(tmp_path / "odd.npz", pixels=np.zeros(2))
    for args, why in (
        (("--ids", "1,x"), "not integers separated by commas"),
        (("--ids", "1", "--media", tmp_path / "odd.npz"), "pixels; it holds generate's media arguments"),
        (("--ids", "1", "--top-k", "5"), "add --sample"),
        (("--ids", "1", "-n", "2"), str(target)),  # not an archive: the reader names it
    ):
        ran = run("llm", "generate", target, *args)
        assert ran.returncode == 2 and why in ran.stderr, (args, ran.stderr)
    ran = run("llm", "generate", tmp_path / "absent", "--ids", "1")
    assert ran.returncode == 2 and "does not exist" in ran.stderr
