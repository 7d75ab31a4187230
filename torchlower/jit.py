"""Public TorchScript-tracing API (``torchlower.jit.ModuleTracer``)."""

from torchlower.frontends.jit import ModuleTracer, maybe_quantize_args

__all__ = ["ModuleTracer", "maybe_quantize_args"]
