"""Shared by every test folder: `gpu-padded`, the gpu target with padded tiles.

The built-in gpu target tiles a matmul dim only where 16 divides it; tests of what happens to
padding (the ONNX writer's Pad and Slice, the memory plan's padded sizes, padding tracking in
propagation, placement across devices) use this subclass, as a user would register one."""
from tilefold.layout.targets import GpuTarget, register_target


class PaddedGpuTarget(GpuTarget):
    name = "gpu-padded"
    pad_tiles = True


register_target(PaddedGpuTarget())
