"""Archives after export: ``load``/``run``, ``inspect`` and ``check`` of what torchlower wrote."""
