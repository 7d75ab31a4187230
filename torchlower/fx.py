"""Public FX API: ``Tracer``, ``Interpreter`` and ``lower_fx`` (generic over ``builder.rules``)."""

from torchlower.frontends.fx import Interpreter, Tracer, lower_fx, trace

__all__ = ["Interpreter", "Tracer", "lower_fx", "trace"]
