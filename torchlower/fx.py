"""Public FX API: ``Tracer``, ``Interpreter`` and ``lower_fx`` (generic over ``builder.rules``)."""

from torchlower.frontends.fx import Interpreter, lower_fx
from torchlower.frontends.fx_trace import Tracer, trace

__all__ = ["Interpreter", "Tracer", "lower_fx", "trace"]
