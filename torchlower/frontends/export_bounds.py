"""Dynamic axes torch.export pinned: export again within the model's own bounds, or
size-oblivious, or raise one paragraph that names the axis, the line and the fix.

torch.export refuses a dynamic axis with "Constraints violated (S)" and suggested fixes. When
PyTorch itself fails just outside a suggested bound (reflect padding needs ``T > pad``), the
bound is the model's and is adopted (noted, asserted in the artifact); a suggested multiple
(``H = 32*_H``, a U-Net) where PyTorch fails at ``H + 1`` and runs at ``H + 32`` is adopted the
same way (the archive declares ``32 * _H``); when the only guards ask whether a derived size is
1 (a ResNet stem), the program is exported size-oblivious and checked at the symbols' lower
bounds too. When all of that fails and the user asked for ``frontend="export"``, torch.export's
own bounds are adopted (declared, noted with a size PyTorch runs at that the archive refuses,
checked at the bound): whisper's log-mel at ``320 <= T``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from torchlower.core.dynamic import not_dynamic
from torchlower.core.dynamic_forms import Form
from torchlower.core.dynamic_probe import adopt_multiple, probe_checks
from torchlower.core.model_io import state_kept
from torchlower.errors import LoweringError
from torchlower.frontends import export_guards
from torchlower.frontends.export_guards import CONSTRAINTS, GUARD, guard_sides, multiples, suggested_fixes
from torchlower.frontends.export_program import export_program
from torchlower.frontends.provenance import raised_at


def export_again(
    builder: Any, module: nn.Module, example: Sequence[Any], spec: Any, exc: LoweringError,
    rounds: int = 2, oblivious: bool = False,
) -> ExportedProgram:  # fmt: skip
    """The program after ``exc`` (torch.export's refusal), or the error that explains it.
    ``rounds``: how many more times a multiple may be adopted (each export can suggest more);
    ``oblivious``: the refused export already reasoned size-obliviously."""
    text = getattr(exc, "torch_message", "")
    pinned = sorted({s for g in CONSTRAINTS.findall(text) for s in g.split(", ")})
    if not pinned:
        raise exc
    wanted = multiples(text, pinned)
    if wanted and rounds > 0 and _models_multiples(module, spec, example, wanted):
        return _export_multiples(builder, module, example, spec, wanted, rounds, oblivious)
    tightened = _model_bounds(spec, pinned, text, module, example)
    if tightened is not None:
        return _export_within(builder, module, example, spec, tightened, text, oblivious)
    if not oblivious and not _pins_a_size(text, pinned, module, spec, example):
        return _export_size_oblivious(builder, module, example, spec, pinned, text, rounds)
    raise _pinned(spec, pinned, text, module, example) from exc


def _export(
    builder: Any, module: nn.Module, example: Sequence[Any], spec: Any, oblivious: bool = False
) -> ExportedProgram:
    import torch.fx.experimental._config as fx_config

    with fx_config.patch(backed_size_oblivious=oblivious):
        return export_program(
            module, example, None, builder.rules, dynamic_shapes=spec.export_dims(example, module)
        )


def _runs(module: nn.Module, spec: Any, example: Sequence[Any], sym: str, value: int) -> bool:
    try:
        with torch.no_grad(), state_kept(module):
            module(*spec.example_at(example, {**spec.base, sym: value}))
    except Exception:
        return False
    return True


def _models_multiples(
    module: nn.Module, spec: Any, example: Sequence[Any], wanted: dict[str, tuple[int, int]]
) -> bool:
    """Whether every multiple torch.export asks for is the model's own: the example is one,
    PyTorch fails one size up and runs a multiple up."""
    for sym, (k, c) in wanted.items():
        v = spec.base[sym]
        if (
            (v - c) % k
            or _runs(module, spec, example, sym, v + 1)
            or not _runs(module, spec, example, sym, v + k)
        ):
            return False
    return True


def _export_multiples(
    builder: Any, module: nn.Module, example: Sequence[Any], spec: Any,
    wanted: dict[str, tuple[int, int]], rounds: int, oblivious: bool,
) -> ExportedProgram:  # fmt: skip
    """Adopt torch.export's multiples (the model's own, ``_models_multiples``), export again."""
    for sym, (k, _) in sorted(wanted.items()):
        where, form = spec.where([sym]), adopt_multiple(spec, sym, k)
        builder.notes.append(
            f"dynamic axis {where}: {sym} = {form.text()} (torch.export's multiple: {sym} must be"
            f" {form.rule()}; PyTorch fails off it); the archive declares it and refuses other sizes"
        )
    probe_checks(spec, lambda inputs: module(*inputs), example)
    example = spec.example_at(example, spec.capture_point())
    try:
        return _export(builder, module, example, spec, oblivious)
    except LoweringError as exc:
        return export_again(builder, module, example, spec, exc, rounds - 1, oblivious)


def _model_bounds(
    spec: Any, symbols: list[str], text: str, module: nn.Module, example: Sequence[Any]
) -> dict[str, tuple[int, int | None]] | None:
    """The bounds torch.export suggests, when they are the model's own: PyTorch itself fails
    just outside each of them (reflect padding needs ``T > pad``), so declaring them restricts
    nothing the model could run. None when a suggestion pins a size or eager PyTorch runs there."""
    found = _suggested_bounds(spec, symbols, text)
    if found is None:
        return None
    for sym, (lo, hi) in found.items():
        if any(_runs(module, spec, example, sym, v) for v in _outside(lo, hi)):
            return None  # PyTorch runs there: a restriction of torch.export, not of the model
    return found


def _suggested_bounds(spec: Any, symbols: list[str], text: str) -> dict[str, tuple[int, int | None]] | None:
    """torch.export's suggested ``Dim('T', min=320)`` for every one of ``symbols``, merged with
    the declared bounds; None when one pins a size, is missing or excludes the example."""
    found: dict[str, tuple[int, int | None]] = {}
    for sym, lo, hi, const in suggested_fixes(text):
        if sym in symbols:
            if const:
                return None
            old_lo, old_hi = spec.bounds.get(sym, (1, None))
            highs = [h for h in (old_hi, int(hi) if hi else None) if h is not None]
            new = (max(old_lo, int(lo or 1)), min(highs) if highs else None)
            if spec.base[sym] < new[0] or (new[1] is not None and spec.base[sym] > new[1]):
                return None
            found[sym] = new
    return found if set(found) == set(symbols) else None


def _narrows_declared(declared: tuple[int, int | None], adopted: tuple[int, int | None]) -> bool:
    """Whether ``adopted`` cuts into a bound the caller set: an upper bound, or a lower one above 1."""
    (lo, hi), (new_lo, new_hi) = declared, adopted
    return (hi is not None and new_hi is not None and new_hi < hi) or (lo > 1 and new_lo > lo)


def _outside(lo: int, hi: int | None) -> list[int]:
    """The sizes just outside ``[lo, hi]`` (none below 1)."""
    return [lo - 1] * (lo > 1) + ([hi + 1] if hi is not None else [])


def _export_restricted(
    builder: Any, module: nn.Module, example: Sequence[Any], spec: Any, symbols: list[str], text: str
) -> ExportedProgram | None:
    """Last resort before refusing: torch.export's own bounds declared though PyTorch runs just
    outside them (whisper's ``stft[..., :-1]`` leaves one frame for 200 <= T < 320, a size
    torch.export specializes; speechbrain's deltas at T < 160). The program is exact inside
    them, so the archive declares them (tract assertions refuse other sizes by name), the report
    says which sizes PyTorch runs at that the archive refuses, and the check runs at the bound.
    None (nothing changed) when torch.export still refuses."""
    bounds = _suggested_bounds(spec, symbols, text) if spec.export_restricts else None
    if bounds is None or any(_narrows_declared(spec.bounds.get(s, (1, None)), b) for s, b in bounds.items()):
        return None  # a range the caller declared (an LLM's context) is refused, not narrowed
    before, notes, kept = dict(spec.bounds), len(builder.notes), len(spec.extra_checks)
    spec.bounds.update(bounds)
    for sym, (lo, hi) in sorted(bounds.items()):
        span = f"{lo} <= {sym}" + (f" <= {hi}" if hi is not None else "")
        runs = [v for v in _outside(lo, hi) if _runs(module, spec, example, sym, v)]
        builder.notes.append(
            f"dynamic axis {spec.where([sym])}: {span} adopted (torch.export's program holds there only;"
            f" PyTorch also runs at {sym}={runs[0] if runs else '?'}, which the archive refuses);"
            f" checked at {sym}={lo}"
        )
        spec.extra_checks.append({**spec.base, sym: lo})
    try:
        return _export(builder, module, example, spec, oblivious=False)
    except LoweringError:
        spec.bounds.clear()
        spec.bounds.update(before)
        del builder.notes[notes:], spec.extra_checks[kept:]
        return None


def _pins_a_size(text: str, symbols: list[str], module: nn.Module, spec: Any, example: Sequence[Any]) -> bool:
    """torch.export found the model fixes a symbol to one size (``S = 2``) and PyTorch agrees:
    it fails at the sizes next to it. (``x[:, -3:]`` at ``S = 2`` is pinned too, yet runs.)"""
    for sym, _, _, const in suggested_fixes(text):
        if sym in symbols and const:
            v = int(const)
            if not (_runs(module, spec, example, sym, v + 1) and _runs(module, spec, example, sym, v + 3)):
                return True
    return False


def _export_size_oblivious(
    builder: Any, module: nn.Module, example: Sequence[Any], spec: Any, symbols: list[str], text: str,
    rounds: int, guards: str | None = None,
) -> ExportedProgram:  # fmt: skip
    """Export again with size-oblivious guards, then check the artifact where they were.

    torch.export restricts a symbol when the model's code asks about a size derived from it
    that PyTorch does not need answered: whether a conv output is 1 (a ResNet stem), whether
    ``S // 2`` is exact (``x[..., : S // 2]`` → ``S = 2*_S``), whether ``S >= 3`` for
    ``x[:, -3:]`` (the slice clamps). Size-oblivious reasoning answers for every size, so the
    program may differ from the model exactly where a guard would have split the sizes: the
    check therefore also runs on both sides of every guard refused (``S = 4`` and ``5``, ``999``
    and ``1000``; ``export_guards.guard_sides``) and with the symbols at their lower bounds.
    ``guards``: the refusal whose guards these are, when not ``text`` (a second one, within
    bounds already adopted). Bounds and multiples the size-oblivious export still asks for are
    adopted as above when they are the model's.
    """
    guards = text if guards is None else guards
    floor = {**spec.base, **{s: spec.bounds.get(s, (1, None))[0] for s in symbols}}
    kept = len(spec.extra_checks), len(spec.skipped)
    sides = guard_sides(spec, symbols, guards)
    points = [floor, *({**spec.base, s: v} for s, values in sorted(sides.items()) for v in values)]
    for point in points:
        _check_at(spec, module, example, point)
    notes = len(builder.notes)
    asked = "; ".join(export_guards.asked(spec, guards, symbols)) or "a guard on a size"
    checked = [p for p in points if p in spec.extra_checks]
    shown = dict.fromkeys(f"{s}={p[s]}" for p in checked for s in symbols if p[s] != spec.base[s])
    builder.notes.append(
        f"dynamic axes {spec.where(symbols)}: torch.export asked for {asked}, which PyTorch does not"
        f" need; exported size-oblivious and checked at {', '.join(shown) or 'the example'} as well"
        " (both sides of the guard, the lower bound)"
    )
    try:
        return _export(builder, module, example, spec, oblivious=True)
    except LoweringError as exc:
        try:
            return export_again(builder, module, example, spec, exc, rounds, oblivious=True)
        except LoweringError:
            del builder.notes[notes:], spec.extra_checks[kept[0] :], spec.skipped[kept[1] :]
            program = _export_restricted(builder, module, example, spec, symbols, text)
            if program is None:
                raise _pinned(spec, symbols, text, module, example) from exc
            return program


_LARGEST_CHECK = 4096  # a guard's far side (``S <= 9999``) checked up to this size only (attention is S²)


def _check_at(spec: Any, module: nn.Module, example: Sequence[Any], point: dict[str, int]) -> None:
    """Check the artifact at ``point`` too, or record why not (PyTorch fails there, or too large)."""
    if point == spec.base or point in spec.extra_checks or any(p == point for p, _ in spec.skipped):
        return
    if max(point.values()) > max(_LARGEST_CHECK, *spec.base.values()):
        spec.skipped.append((point, f"not checked: larger than {_LARGEST_CHECK}, the check's largest size"))
        return
    try:
        with torch.no_grad(), state_kept(module):
            module(*spec.example_at(example, point))
        spec.extra_checks.append(point)
    except Exception as exc:  # PyTorch itself refuses that size: nothing to compare there
        spec.skipped.append((point, f"PyTorch fails there ({type(exc).__name__})"))


def _export_within(
    builder: Any, module: nn.Module, example: Sequence[Any], spec: Any, bounds: dict[str, Any], text: str,
    oblivious: bool,
) -> ExportedProgram:  # fmt: skip
    """Export again with the model's own bounds declared; they become tract assertions. When
    torch.export still refuses, the first refusal (with its suggestion) is the one reported."""
    before, notes = dict(spec.bounds), len(builder.notes)
    spec.bounds.update(bounds)
    for sym, (lo, hi) in sorted(bounds.items()):
        span = f"{lo} <= {sym}" + (f" <= {hi}" if hi is not None else "")
        builder.notes.append(
            f"dynamic axis {spec.where([sym])}: {span} (torch.export's bound; PyTorch fails outside it)"
        )
    try:
        return _export(builder, module, example, spec, oblivious)
    except LoweringError as exc:
        if not oblivious:  # within the bounds something else is asked (STFT frames: "is a size 1?")
            try:
                inner = getattr(exc, "torch_message", text)
                return _export_size_oblivious(builder, module, example, spec, sorted(bounds), text, 1, inner)
            except LoweringError:
                pass
        spec.bounds.clear()
        spec.bounds.update(before)
        del builder.notes[notes:]
        raise _pinned(spec, sorted(bounds), text, module, example) from exc


def _pinned(spec: Any, symbols: list[str], text: str, module: nn.Module, example: Sequence[Any]) -> Any:
    """One paragraph for a dynamic axis torch.export restricted: what it needs, where, the fix.

    torch's "Suggested fixes" say what the model accepts (``S = Dim('S', min=3)``, ``B = 2``);
    the model is run at a size just outside that, so the line that refuses it can be named.
    """
    needs, fixes, lines = [], [], []
    for sym, (k, c) in sorted(multiples(text, symbols).items()):
        rule, (name, axis) = Form("h", k, c), _axis_of(spec, sym)
        needs.append(f"torch.export needs {sym} to be {rule.rule()} ({sym} = {Form('_' + sym, k, c).text()})")
        runs = [
            s for s in (spec.base[sym] + 1, spec.base[sym] + k // 2) if _runs(module, spec, example, sym, s)
        ]
        if runs:
            lines.append(f"PyTorch runs at {sym}={runs[0]} (the model does not need it; torch.export does)")
        derived = f"{k}*Dim('h')" + (f" {'+' if c > 0 else '-'} {abs(c)}" if c else "")
        fixes.append(
            f"declare the multiple: dynamic_axes={{{name!r}: {{{axis}: {rule.text()!r}}}}} or {derived} in"
            " dynamic_shapes (the archive then takes only such sizes)"
        )
    for sym, lo, hi, const in suggested_fixes(text):
        if sym not in symbols:
            continue
        if const:
            needs.append(f"torch.export found that the model fixes {sym} to {const}")
            outside = int(const) + 1
        else:
            span = f"{lo or 1} <= {sym}" + (f" <= {hi}" if hi else "")
            needs.append(f"torch.export can only export the model for {span}")
            name, axis = _axis_of(spec, sym)
            bound = f"({sym!r}, {lo or 1}, {hi or None})"
            fixes.append(
                f"declare the bound: Dim({sym!r}, min={lo or 1}{f', max={hi}' if hi else ''}) in"
                f" dynamic_shapes, or dynamic_axes={{{name!r}: {{{axis}: {bound}}}}}"
            )
            outside = int(lo) - 1 if lo and int(lo) > 1 else (int(hi) + 1 if hi else 0)
        if outside >= 1:
            try:
                with torch.no_grad(), state_kept(module):
                    module(*spec.example_at(example, {**spec.base, sym: outside}))
            except Exception as exc:
                found = raised_at(exc)
                first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
                lines.append(f"at {sym}={outside} it fails at {found} ({first})" if found else "")
    if not needs:  # no suggestion: torch's guards, in the symbols' names
        guards = GUARD.findall(text)
        named = [re.sub(r"L\['\w+'\]\.size\(\)\[\d+\]", "/".join(symbols), g) for g in guards]
        named = [g.replace("IntInfinity()", "inf") for g in named]
        needs = [f"torch.export needs {' and '.join(dict.fromkeys(named))}" if named else ""]
    what = "; ".join(n for n in needs if n) or "torch.export specialized it"
    what += "".join(f"; {line}" for line in lines if line)
    advice = "; or ".join([*fixes, "make the axis static (drop it from the dynamic axes)"])
    return not_dynamic(spec, symbols, f"{what}. To export: {advice}", advice=False)


def _axis_of(spec: Any, sym: str) -> tuple[str, int | str]:
    """The input name and axis of ``sym``'s first axis, for the spellings in messages."""
    where = spec.where([sym])
    axis = where.split(" axis ")[1].split()[0] if " axis " in where else "?"
    return (where.split("'")[1] if "'" in where else "x"), int(axis) if axis.isdigit() else axis
