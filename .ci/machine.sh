#!/usr/bin/env bash
# The machine a test report comes from: CPU model, SIMD flags, torch's BLAS and CPU capability,
# and the environment variables that change them. Printed before the tests (`make test`, and so
# `.ci/run`) so that a failure on another machine says what differed. Never fails: a missing
# lscpu, /proc or torch prints "unknown" and the tests run anyway.
# Usage: .ci/machine.sh [python]   (default: .venv/bin/python, else python3)
set +e
PY="${1:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3

echo "== machine (for failure reports)"
model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
[ -n "$model" ] || model=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)
[ -n "$model" ] || model=$(sysctl -n machdep.cpu.brand_string 2>/dev/null)
cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)
echo "cpu:   ${model:-unknown} (${cpus:-?} logical CPUs, $(uname -sm 2>/dev/null))"
flags=$(grep -m 1 -E '^(flags|Features)[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2)
[ -n "$flags" ] || flags=$(sysctl -n machdep.cpu.features machdep.cpu.leaf7_features 2>/dev/null | tr 'A-Z' 'a-z')
simd=$(printf '%s\n' $flags | grep -E '^(sse4_2|sse4\.2|avx|fma|f16c|amx|asimd|sve|bf16|i8mm)' | sort -u | tr '\n' ' ')
echo "simd:  ${simd:-unknown}"

"$PY" - <<'PYEOF' 2>&1 || echo "torch: could not be queried with $PY"
import os
import platform

try:
    import torch
except Exception as error:  # noqa: BLE001 - informative only
    print(f"torch: not importable ({error})")
    raise SystemExit(0) from None

print(
    f"torch: {torch.__version__} (python {platform.python_version()}), "
    f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
)
for line in torch.__config__.show().splitlines()[1:]:
    line = line.strip().removeprefix("- ")
    if line.startswith("Build settings:"):  # one long line: keep what decides the arithmetic
        keep = ("BLAS_INFO", "LAPACK_INFO", "USE_MKL", "USE_MKLDNN", "USE_OPENMP", "TORCH_VERSION")
        items = [i.strip() for i in line.removeprefix("Build settings:").split(",")]
        line = "Build settings: " + ", ".join(i for i in items if i.startswith(keep))
    if line:
        print(f"       {line}")
prefixes = ("ATEN_", "MKL_", "OMP_", "KMP_", "GOMP_", "DNNL_", "ONEDNN_", "OPENBLAS_", "RAYON_")
env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}
print("env:  ", " ".join(f"{k}={v}" for k, v in env.items()) or "(no ATEN_/MKL_/OMP_/... variables)")
try:
    from importlib.metadata import version

    print("tract:", version("tract"))
except Exception:  # noqa: BLE001 - informative only
    pass
PYEOF
echo "=="
exit 0
