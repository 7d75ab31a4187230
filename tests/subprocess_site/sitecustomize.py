"""Loaded by the Python of every CLI subprocess the tests start (``tests/test_cli.py``'s ``env``).

The dev venv carries torchvision's CUDA-only wheel (the one pinned to torch 2.13.0) for the
vision-model tests; transformers imports torchvision, so a subprocess needs the same bypass as
the test process (``tests/torchvision_shim.py``); torchaudio's CUDA wheel too (transformers'
``audio_utils`` imports it). A user's install has no such wheel.
"""

from tests import torchvision_shim

torchvision_shim.install()
torchvision_shim.install_torchaudio()
