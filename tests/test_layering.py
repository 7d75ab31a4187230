"""The package's layers, read from its own imports (``ast``, no import is executed).

Every ``import`` statement counts, also those inside functions: a lazy import is still a
dependency, and a circle hidden in a function is still a circle. Each failure names the edge.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "torchlower"

# package → the packages its modules may import (itself always). ``errors`` and ``core`` are the
# vocabulary of every layer; the two targets (nnef, lattice) never import each other; rules lower
# into the NNEF builder; front ends call rules; the pipeline composes front ends and the NNEF
# target; artifacts are read back above it; llm builds on the pipeline; the CLI sits on top.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "_moved": set(),
    "core": {"errors"},
    "nnef": {"errors", "core"},
    "rules": {"errors", "core", "nnef"},
    "frontends": {"errors", "core", "rules"},
    "lattice": {"errors", "core", "rules", "frontends"},
    "pipeline": {"errors", "core", "nnef", "rules", "frontends"},
    "artifact": {"errors", "core", "nnef", "lattice", "pipeline"},
    "llm": {"errors", "core", "nnef", "pipeline", "__init__"},
    "cli": {"errors", "core", "nnef", "rules", "lattice", "pipeline", "artifact", "llm", "__init__"},
    "__init__": {"_moved", "pipeline", "artifact", "rules"},
    "__main__": {"cli"},
}
PRESENTATION = ("rich",)  # terminal presentation: the CLI's alone


def module_name(path: Path) -> str:
    parts = ("torchlower", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve(name: str) -> str:
    """The deepest torchlower module a dotted name lies in (``torchlower.nnef.dat.header`` →
    ``torchlower.nnef.dat``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> list[tuple[str, str, int]]:
    """(imported torchlower module, imported name or "", line) for each import in ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    out: list[tuple[str, str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(resolve(a.name), "", node.lineno) for a in node.names if a.name.startswith("torchlower")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{module}:{node.lineno}: relative import (write the full path)")
            base = node.module or ""
            if base.split(".")[0] != "torchlower":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in MODULES else resolve(base)
                out.append((target, "" if full in MODULES else alias.name, node.lineno))
    return out


GRAPH = {m: imports(m) for m in MODULES}


def circles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    edges = {m: sorted({t for t, _, _ in GRAPH[m] if t != m}) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles() -> None:
    found = circles()
    detail = [
        " ↔ ".join(c) + ": " + "; ".join(f"{a} → {t}" for a in c for t, _, _ in GRAPH[a] if t in c)
        for c in found
    ]
    assert not found, "import circles:\n" + "\n".join(detail)


def test_no_forbidden_edges() -> None:
    bad = sorted(
        f"{MODULES[m].relative_to(ROOT.parent)}:{line}: {package_of(m)} → {package_of(t)} ({m} imports {t})"
        for m in MODULES
        for t, _, line in GRAPH[m]
        if package_of(t) != package_of(m) and package_of(t) not in ALLOWED[package_of(m)]
    )
    assert not bad, "imports across a forbidden edge:\n" + "\n".join(bad)


def test_every_package_has_a_place_in_the_layers() -> None:
    assert {package_of(m) for m in MODULES} <= set(ALLOWED), "a new package: give it its layer in ALLOWED"


def test_no_private_names_across_modules() -> None:
    """``from torchlower.x import _y`` and ``x._y`` on an imported torchlower module: what another
    module needs is public there (or the code moves)."""
    bad = []
    for m, path in MODULES.items():
        bad += [
            f"{path.relative_to(ROOT.parent)}:{line}: imports {name} from {t}"
            for t, name, line in GRAPH[m]
            if name.startswith("_") and not name.startswith("__") and t != m
        ]
        tree = ast.parse(path.read_text())
        bound = _module_aliases(tree)
        bad += [
            f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and bound[node.value.id] != m
        ]
    assert not bad, "private names used across modules:\n" + "\n".join(sorted(set(bad)))


def _module_aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound to torchlower modules by ``import`` / ``from … import module``."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchlower"):
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    bound[a.asname] = a.name
    return bound


def test_presentation_only_in_the_cli() -> None:
    bad = []
    for m, path in MODULES.items():
        if package_of(m) == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad += [
                f"{path.relative_to(ROOT.parent)}:{node.lineno}: {n}"
                for n in names
                if n.split(".")[0] in PRESENTATION
            ]
    assert not bad, "terminal presentation outside torchlower/cli:\n" + "\n".join(bad)


def test_the_checker_sees_edges_and_circles(tmp_path: Path) -> None:
    """The checks above can fail: a module pair importing each other is a circle, and a
    core module importing a front end is a forbidden edge."""
    global GRAPH
    saved = dict(GRAPH)
    try:
        GRAPH["torchlower.core.values"] = [
            *saved["torchlower.core.values"],
            ("torchlower.frontends.session", "", 1),
        ]
        assert any("torchlower.core.values" in c for c in circles())
        try:
            test_no_forbidden_edges()
        except AssertionError as exc:
            assert "core → frontends" in str(exc)
        else:
            raise AssertionError("a core → frontends import was not reported")
    finally:
        GRAPH = saved


def layer_counts() -> dict[str, set[str]]:
    """Which packages import which (for docs/architecture.md)."""
    out: dict[str, set[str]] = defaultdict(set)
    for m in MODULES:
        out[package_of(m)] |= {package_of(t) for t, _, _ in GRAPH[m]} - {package_of(m)}
    return dict(out)


def test_old_import_paths_resolve_to_the_moved_modules() -> None:
    """``torchlower.io`` & co. (before issue 27) are the moved modules themselves, with a
    DeprecationWarning naming the new path; ``torchlower.jit`` / ``torchlower.fx`` stay public."""
    import importlib
    import sys
    import warnings

    from torchlower import _moved

    for old, new in {**_moved.MOVED, **_moved.PUBLIC}.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        deprecations = [
            w for w in caught if issubclass(w.category, DeprecationWarning) and new in str(w.message)
        ]
        assert bool(deprecations) == (old in _moved.MOVED), (old, [str(w.message) for w in caught])
    assert set(_moved.MOVED) | set(_moved.PUBLIC) <= {f"torchlower.{n}" for n in _OLD_LOOSE}


# the modules that lay loose in torchlower/ before issue 27 (errors.py stays: the public hierarchy)
_OLD_LOOSE = {
    *("api", "io", "runner", "model_check", "verification", "coverage", "dynamic", "dynamic_sizes"),
    *("dynamic_shapes", "validate", "tolerance", "progress", "values", "dtypes", "model_io", "demo"),
    *("jit", "fx"),
}
