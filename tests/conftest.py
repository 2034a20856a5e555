"""Shared by every test folder: `gpu-padded`, the gpu target with padded tiles, and the
hypothesis profiles.

The built-in gpu target tiles a matmul dim only where 16 divides it; tests of what happens to
padding (the ONNX writer's Pad and Slice, the memory plan's padded sizes, padding tracking in
propagation, placement across devices) use this subclass, as a user would register one."""
import os

from hypothesis import settings

from tilefold.layout.targets import GpuTarget, register_target

settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
"""`make test` (what CI runs) loads "ci": the same examples on every run, so a landing is never
refused for an example no one has seen. `make test-quick` and plain pytest explore new ones."""


class PaddedGpuTarget(GpuTarget):
    name = "gpu-padded"
    pad_tiles = True


register_target(PaddedGpuTarget())
