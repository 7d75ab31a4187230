"""Hostile and malformed artifacts: each one is refused with an ``ArtifactError`` naming the rule.

Archives are built here with tarfile/gzip (no torch), so the table runs in a second or two.
docs/reliability.md lists the same cases and what each gets.
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
import struct
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import torchlower
from torchlower.errors import ArtifactError
from torchlower.nnef import dat, reader
from torchlower.nnef.reader import Limits

GRAPH = """version 1.0;

extension tract_registry tract_core;

graph network(x) -> (y)
{
    x = tract_core_external(shape = [2, 3], datum_type = 'f32');
    w = variable<scalar>(label = 'w', shape = [2, 3]);
    y = add(x, w);
}
"""
W = dat.encode(np.arange(6, dtype=np.float32).reshape(2, 3))
MiB = 2**20


def info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.type, ti.linkname, ti.mode = size, kind, link, 0o644
    return ti


def build(
    path: Path,
    entries: list[tuple[tarfile.TarInfo, bytes | None]],
    gz: bool = True,
    fmt: int = tarfile.GNU_FORMAT,
) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for ti, data in entries:
            if data is not None:
                ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data) if data else None)
    raw = buf.getvalue()
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    return path


def files(
    *extra: tuple[str, bytes], graph: str = GRAPH, w: bytes | None = W
) -> list[tuple[tarfile.TarInfo, bytes]]:
    out = [(info("graph.nnef"), graph.encode())]
    if w is not None:
        out.append((info("w.dat"), w))
    return out + [(info(n), b) for n, b in extra]


def with_graph(text: str) -> Callable[[Path], Path]:
    return lambda p: build(p, files(graph=text))


def with_dat(blob: bytes) -> Callable[[Path], Path]:
    return lambda p: build(p, files(w=blob))


def patch(blob: bytes, offset: int, fmt: str, *values: int) -> bytes:
    return blob[:offset] + struct.pack(fmt, *values) + blob[offset + struct.calcsize(fmt) :]


def pax_bomb(p: Path) -> Path:
    ti = info("graph.nnef")
    ti.pax_headers = {"comment": "x" * (2 * MiB)}
    return build(p, [(ti, GRAPH.encode()), (info("w.dat"), W)], fmt=tarfile.PAX_FORMAT)


def sparse(p: Path) -> Path:
    return build(p, [*files(), (info("s.dat", kind=tarfile.GNUTYPE_SPARSE), None)])


def truncated_gzip(p: Path) -> Path:
    build(p, files(("pad.dat", os.urandom(4096))))
    p.write_bytes(p.read_bytes()[:-2000])
    return p


def huge_declared(p: Path) -> Path:
    return build(p, [*files(), (info("big.dat", size=100 * 2**30), None)])


def deep(p: Path) -> Path:
    return build(p, files(("/".join(["d"] * 40) + "/x.dat", W)))


def bzip2(p: Path) -> Path:
    build(p, files(), gz=False)
    p.write_bytes(bz2.compress(p.read_bytes()))
    return p


_G = GRAPH.splitlines()


def graph_with(line: int, text: str) -> str:
    """GRAPH with line ``line`` (1-based) replaced by ``text``."""
    return "\n".join([*_G[: line - 1], text, *_G[line:]]) + "\n"


# (case id, how to build the hostile artifact, limits, message fragment)
CASES: list[tuple[str, Callable[[Path], Path], Limits | None, str]] = [
    # ---- container --------------------------------------------------------------------------
    ("absolute-path", lambda p: build(p, files(("/tmp/evil.dat", W))), None, "absolute path"),
    ("dotdot", lambda p: build(p, files(("../evil.dat", W))), None, r"climbs out.*'\.\.'"),
    ("dotdot-inner", lambda p: build(p, files(("a/../../evil.dat", W))), None, "climbs out"),
    (
        "symlink",
        lambda p: build(p, [*files(), (info("l.dat", kind=tarfile.SYMTYPE, link="/etc/passwd"), None)]),
        None,
        "symbolic link",
    ),
    (
        "hardlink",
        lambda p: build(p, [*files(), (info("h.dat", kind=tarfile.LNKTYPE, link="w.dat"), None)]),
        None,
        "hard link",
    ),
    (
        "char-device",
        lambda p: build(p, [*files(), (info("zero.dat", kind=tarfile.CHRTYPE), None)]),
        None,
        "device",
    ),
    (
        "block-device",
        lambda p: build(p, [*files(), (info("sda.dat", kind=tarfile.BLKTYPE), None)]),
        None,
        "device",
    ),
    ("fifo", lambda p: build(p, [*files(), (info("f.dat", kind=tarfile.FIFOTYPE), None)]), None, "FIFO"),
    ("sparse", sparse, None, "not a regular file"),
    ("duplicate", lambda p: build(p, files(("w.dat", W))), None, "appears twice"),
    (
        "duplicate-dot-slash",
        lambda p: build(p, files(("./graph.nnef", GRAPH.encode()))),
        None,
        "appears twice",
    ),
    ("file-and-folder", lambda p: build(p, files(("w.dat/x.dat", W))), None, "is a file"),
    ("backslash", lambda p: build(p, files(("..\\evil.dat", W))), None, "backslash"),
    ("control-char", lambda p: build(p, files(("e\x1bvil.dat", W))), None, "control character"),
    ("too-deep", deep, None, "nested deeper"),
    ("huge-declared-size", huge_declared, None, "declares 107374182400 bytes"),
    (
        "members-over-total",
        lambda p: build(p, files(*[(f"z{i}.dat", bytes(MiB)) for i in range(4)])),
        Limits(max_total_bytes=2 * MiB),
        "more than 2097152 bytes|exceeds 2097152",
    ),
    ("gzip-bomb-stream", pax_bomb, Limits(max_total_bytes=MiB, max_header_bytes=8 * MiB), "exceeds 1048576"),
    ("pax-header-bomb", pax_bomb, None, "extended tar header"),
    (
        "too-many-members",
        lambda p: build(p, files(*[(f"m{i}.dat", W) for i in range(10)])),
        Limits(max_members=5),
        "more than 5 members",
    ),
    (
        "graph-too-big",
        lambda p: build(p, files(graph=GRAPH + "#" * 4096)),
        Limits(max_graph_bytes=1024),
        "graph.nnef",
    ),
    ("truncated-gzip", truncated_gzip, None, "not a readable tgz"),
    ("not-an-archive", lambda p: (p.write_bytes(os.urandom(3000)), p)[1], None, "not a readable tar"),
    ("bzip2-tar", bzip2, None, "not a readable tar"),
    ("no-graph", lambda p: build(p, [(info("w.dat"), W)]), None, "no graph.nnef"),
    (
        "unexpected-member",
        lambda p: build(p, files(("run.sh", b"rm -rf ~"))),
        None,
        "unexpected member 'run.sh'",
    ),
    ("missing-dat", lambda p: build(p, files(w=None)), None, r"line 8: variable 'w' has no 'w.dat'"),
    # ---- .dat headers -------------------------------------------------------------------------
    ("dat-magic", with_dat(b"PK" + W[2:]), None, r"w\.dat: bad magic"),
    ("dat-version", with_dat(patch(W, 2, "<B", 2)), None, r"w\.dat: unsupported version"),
    ("dat-rank", with_dat(patch(W, 8, "<I", 9)), None, r"w\.dat: rank 9"),
    ("dat-dims-overflow-u64", with_dat(patch(W, 8, "<I8I", 8, *([2**32 - 1] * 8))), None, r"w\.dat: dims"),
    (
        "dat-dims-wrap-u32",
        with_dat(patch(patch(W, 4, "<I", 0), 8, "<III", 2, 65536, 65536)[:128]),
        None,
        r"w\.dat: dims \[65536, 65536\] need 17179869184 bytes",
    ),
    ("dat-length", with_dat(W[:-4]), None, r"w\.dat: data length"),
    ("dat-item-type", with_dat(patch(W, 48, "<H", 9)), None, r"w\.dat: unknown item type 9"),
    ("dat-zero-bits", with_dat(patch(W, 44, "<I", 0)), None, r"w\.dat: unknown item type 0 with 0 bits"),
    (
        "dat-shape-vs-graph",
        with_dat(dat.encode(np.zeros((3, 2), np.float32))),
        None,
        "differs from graph.nnef line 8",
    ),
    (
        "dat-dtype-vs-graph",
        with_dat(dat.encode(np.zeros((2, 3), np.int32))),
        None,
        r"cannot back a variable<scalar>",
    ),
    # ---- graph.nnef ---------------------------------------------------------------------------
    ("graph-truncated", with_graph(GRAPH[: GRAPH.index("y = add")]), None, "line 9: text ends early"),
    (
        "graph-input-assigned-again",  # tract tolerates re-assignment, but an input must stay one
        with_graph(graph_with(9, "    x = add(x, w);\n    y = add(x, w);")),
        None,
        r"line 9: input 'x' is assigned again \(declared at line 7\)",
    ),
    (
        "graph-undefined",
        with_graph(graph_with(9, "    y = add(x, ghost);")),
        None,
        "line 9: 'ghost' is not defined",
    ),
    (
        "graph-use-before-def",
        with_graph(
            GRAPH.replace("    w = var", "    v = add(x, w);\n    w = var")
            .replace("add(x, w)", "add(x, v)", 1)
            .replace("v = add(x, v)", "v = add(x, w)")
        ),
        None,
        "line 8: 'w' is used before its assignment",
    ),
    (
        "graph-unknown-op",
        with_graph(graph_with(9, "    y = system(x, w);")),
        None,
        "line 9: unknown op 'system'",
    ),
    (
        "graph-output-unassigned",
        with_graph(GRAPH.replace("-> (y)", "-> (y, z)")),
        None,
        "output 'z' is never assigned",
    ),
    (
        "graph-no-version",
        with_graph(GRAPH.replace("version 1.0;", "")),
        None,
        "must start with 'version 1.0;'",
    ),
    (
        "graph-version-2",
        with_graph(GRAPH.replace("version 1.0;", "version 2.0;")),
        None,
        "unsupported NNEF version",
    ),
    (
        "graph-deep-nesting",
        with_graph(graph_with(9, "    y = add(x, " + "[" * 5000 + "]" * 5000 + ");")),
        None,
        "line 9: nesting deeper than 64",
    ),
    (
        "graph-not-utf8",
        lambda p: build(p, [(info("graph.nnef"), GRAPH.encode() + b"\xff\xfe"), (info("w.dat"), W)]),
        None,
        "line 11: not UTF-8",
    ),
    ("graph-nul", with_graph(GRAPH.replace("add", "a\0dd")), None, "line 9: NUL byte"),
    (
        "graph-unterminated-string",
        with_graph(graph_with(8, "    w = variable<scalar>(label = 'w, shape = [2, 3]);")),
        None,
        "line 8: unterminated string",
    ),
    ("graph-trailing-text", with_graph(GRAPH + "graph again() -> () {}\n"), None, "after the graph body"),
    (
        "graph-input-not-external",
        with_graph(graph_with(7, "    x = copy(1.0);")),
        None,
        "input 'x' is not declared with external",
    ),
    (
        "graph-variable-no-label",
        with_graph(graph_with(8, "    w = variable<scalar>(shape = [2, 3]);")),
        None,
        "line 8: variable needs one result and a string label",
    ),
    (
        "graph-huge-int",
        with_graph(
            graph_with(8, "    w = variable<scalar>(label = 'w', shape = [2, 99999999999999999999]);")
        ),
        None,
        "line 8: integer literal out of the 64-bit range",
    ),
    (
        "graph-attr-twice",
        with_graph(graph_with(8, "    w = variable<scalar>(label = 'w', label = 'v', shape = [2, 3]);")),
        None,
        "line 8: attribute 'label' given twice",
    ),
]


@pytest.mark.parametrize(("make", "limits", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_archive_is_refused(tmp_path, make, limits, match):
    path = make(tmp_path / "hostile.nnef.tgz")
    before = set(tmp_path.iterdir())
    with pytest.raises(ArtifactError, match=match):
        torchlower.load(path, limits or reader.DEFAULT_LIMITS)
    assert set(tmp_path.iterdir()) == before, "reading must not write next to the artifact"


def test_the_base_artifact_is_valid(tmp_path):
    """The cases above differ from a valid artifact by one defect each."""
    art = torchlower.load(build(tmp_path / "ok.nnef.tgz", files()))
    np.testing.assert_array_equal(art.weights["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert torchlower.load(build(tmp_path / "ok.nnef.tar", files(), gz=False)).graph.outputs == ["y"]


def test_check_refuses_before_tract_and_writes_nothing_outside(tmp_path):
    path = build(tmp_path / "evil.nnef.tgz", files(("../../pwned.dat", W)))
    tmp_root = Path(tempfile.gettempdir())
    before = {p.name for p in tmp_root.glob("torchlower-artifact-*")}
    with pytest.raises(ArtifactError, match="climbs out"):
        torchlower.check(path)
    assert {p.name for p in tmp_root.glob("torchlower-artifact-*")} == before, "temporary folder left behind"
    assert not list(tmp_path.parent.parent.glob("pwned*")) and not list(tmp_path.glob("**/pwned*"))


def test_extracted_folder_is_private_and_removed(tmp_path):
    path = build(tmp_path / "ok.nnef.tgz", files())
    with reader.extracted(path) as folder:
        assert (folder.stat().st_mode & 0o077) == 0, "the temporary folder must be private"
        assert sorted(p.name for p in folder.iterdir()) == ["graph.nnef", "w.dat"]
    assert not folder.exists()
    with pytest.raises(RuntimeError), reader.extracted(path) as folder:
        raise RuntimeError("caller fails")
    assert not folder.exists()


def make_dir(tmp_path: Path) -> Path:
    d = tmp_path / "m.nnef"
    d.mkdir()
    (d / "graph.nnef").write_text(GRAPH)
    (d / "w.dat").write_bytes(W)
    return d


@pytest.mark.parametrize(
    ("defect", "match"),
    [
        (lambda d: (d / "w.dat").unlink() or os.symlink("/etc/passwd", d / "w.dat"), "symbolic link"),
        (lambda d: os.mkfifo(d / "f.dat"), "not a regular file"),
        (lambda d: os.symlink("/", d / "root"), "symbolic link"),
        (lambda d: (d / "w.dat").write_bytes(W + b"\0"), "data length"),
        (lambda d: (d / "notes.txt").write_text("hi"), "unexpected member 'notes.txt'"),
    ],
    ids=["dat-symlink-to-passwd", "fifo", "dir-symlink", "dat-trailing-byte", "foreign-file"],
)
def test_hostile_directory_is_refused(tmp_path, defect, match):
    d = make_dir(tmp_path)
    assert torchlower.load(d).graph.name == "network"
    defect(d)
    with pytest.raises(ArtifactError, match=match):
        torchlower.load(d)


def test_number_of_hostile_cases():
    assert len(CASES) >= 20
