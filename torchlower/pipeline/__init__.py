"""The export pipeline as named stages (validate → capture → lower → compress → optimize →
write → check → report) and ``torchlower.export``, their shortest composition."""
