"""Resize: separable resampling, one axis at a time, only the axes that change.

Per resized axis, each call computes the source coordinate of every output position
(coordinate_transformation_mode), then either one index array (nearest) or a few
(index, weight) columns, one per filter tap (linear, cubic, and their antialiased forms);
the axis is then a gather per tap and a weighted sum over whole arrays. Indices outside
the input are clamped (edge values), as ONNX's reference and onnxruntime do.

One filter covers linear and cubic with and without antialias (ONNX's reference in closed
form): with s = min(scale, 1) under antialias (else 1) and a filter of radius R (1 linear,
2 cubic), the taps are floor(x) + start + k for k < 2 - 2 start, start = floor(-R / s) + 1,
each weighted by filter((tap - x) * s); antialiased weights are normalized to sum 1.

This follows ONNX's reference and conformance data where onnxruntime departs from them: it
copies an axis whose extent a scale other than 1 leaves unchanged (10 * 1.05 -> 10), it
computes source coordinates in float32 (so a tie such as 11.5 / 2.3 - 0.5 rounds otherwise),
and under align_corners it divides by the rounded output size, not scale * n.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ....graph.errors import VerifyError
from ....graph.ops.resize import AxisResize, check_attrs, resized_axes, unchanged
from ....graph.registry import with_defaults
from ..registry import KernelSpec, Run, kernel
from .common import check_dtypes, unsupported

Coordinates = Callable[[np.ndarray, AxisResize, int], np.ndarray]


def _half_pixel_symmetric(y: np.ndarray, r: AxisResize, n: int) -> np.ndarray:
    offset = n / 2 * (1 - r.size / (r.scale * n))
    return offset + (y + 0.5) / r.scale - 0.5


def _align_corners(y: np.ndarray, r: AxisResize, n: int) -> np.ndarray:
    length = r.scale * n
    return np.zeros_like(y) if length == 1 else y * (n - 1) / (length - 1)


def _pytorch_half_pixel(y: np.ndarray, r: AxisResize, n: int) -> np.ndarray:
    return np.full_like(y, -0.5) if r.scale * n == 1 else (y + 0.5) / r.scale - 0.5


def _tf_crop_and_resize(y: np.ndarray, r: AxisResize, n: int) -> np.ndarray:
    (start, end), length = r.roi, r.scale * n
    if length == 1:
        return np.full_like(y, (end - start) * (n - 1) / 2 + start * (n - 1))
    return y * (end - start) * (n - 1) / (length - 1) + start * (n - 1)


COORDINATES: dict[str, Coordinates] = {
    "half_pixel": lambda y, r, n: (y + 0.5) / r.scale - 0.5,
    "half_pixel_symmetric": _half_pixel_symmetric,
    "pytorch_half_pixel": _pytorch_half_pixel,
    "align_corners": _align_corners,
    "asymmetric": lambda y, r, n: y / r.scale,
    "tf_crop_and_resize": _tf_crop_and_resize,
}
"""coordinate_transformation_mode -> source coordinate of output positions y along an axis
of n input elements (ONNX's formulas; "length" is the unrounded scale * n)."""

ROUNDING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _linear(t: np.ndarray, a: float) -> np.ndarray:
    return np.maximum(0.0, 1.0 - np.abs(t))


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with coefficient a."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


FILTERS: dict[str, tuple[int, Callable[[np.ndarray, float], np.ndarray]]] = {
    "linear": (1, _linear), "cubic": (2, _cubic),
}
"""mode -> (radius, filter(t, cubic_coeff_a))."""


def taps(attrs: dict[str, Any], r: AxisResize, n: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(indices (out, taps), weights (out, taps) or None for nearest, mask of the output
    positions that take extrapolation_value or None) for one resized axis of n elements."""
    x = COORDINATES[attrs["coordinate_transformation_mode"]](np.arange(r.size, dtype=np.float64), r, n)
    outside = (x < 0) | (x > n - 1) if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize" else None
    mode = attrs["mode"]
    if mode == "nearest":
        index = ROUNDING[attrs["nearest_mode"]](x).astype(np.intp)[:, None]
        return np.clip(index, 0, n - 1), None, outside
    radius, filt = FILTERS[mode]
    antialias = bool(attrs["antialias"]) and r.scale < 1
    s = r.scale if antialias else 1.0
    start = int(np.floor(-radius / s)) + 1
    index = np.floor(x).astype(np.intp)[:, None] + start + np.arange(2 - 2 * start)
    weights = filt((index - x[:, None]) * s, float(attrs["cubic_coeff_a"]))
    if antialias:
        weights /= weights.sum(axis=1, keepdims=True)
    if attrs["exclude_outside"]:
        weights[(index < 0) | (index >= n)] = 0.0
        total = weights.sum(axis=1, keepdims=True)
        weights /= np.where(total == 0, 1.0, total)
    return np.clip(index, 0, n - 1), weights, outside


def resize_axis(data: np.ndarray, axis: int, index: np.ndarray, weights: np.ndarray | None,
                outside: np.ndarray | None, fill: float) -> np.ndarray:
    """`data` resampled along `axis`: a gather per tap column, weighted and summed."""
    if weights is None:
        out = np.take(data, index[:, 0], axis=axis)
    else:
        shape = (-1,) + (1,) * (data.ndim - axis - 1)
        w = weights.astype(data.dtype)
        out = np.take(data, index[:, 0], axis=axis) * w[:, 0].reshape(shape)
        for k in range(1, index.shape[1]):
            out += np.take(data, index[:, k], axis=axis) * w[:, k].reshape(shape)
    if outside is not None and outside.any():
        mask = (slice(None),) * axis + (outside,)
        out[mask] = fill
    return out


_WIDE = {np.dtype(np.float16): np.dtype(np.float32)}


def resize(attrs: dict[str, Any], x: np.ndarray, plan: list[AxisResize]) -> np.ndarray:
    """X resized along every axis of `plan` that changes it. Floats compute in their own
    type (float16 in float32); integers gather as they are (nearest) or interpolate in
    float64 and round back, saturating."""
    dtype = x.dtype
    interpolates = attrs["mode"] != "nearest"
    work = _WIDE.get(dtype, dtype if dtype.kind == "f" or not interpolates else np.dtype(np.float64))
    y = x.astype(work, copy=False)
    for r in plan:
        if not unchanged(r):
            y = resize_axis(y, r.axis, *taps(attrs, r, y.shape[r.axis]), float(attrs["extrapolation_value"]))
    if y.dtype == dtype:
        return y if y is not x else x.copy()
    if dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        y = np.rint(y) if info is None else np.clip(np.rint(y), info.min, info.max)
    return y.astype(dtype)


@kernel("Resize")
def _resize(spec: KernelSpec) -> Run:
    """The plan (extents, scales, roi per axis) is fixed at build time when roi, scales
    and sizes are constants, else worked out per call from their values."""
    check_dtypes(spec)
    attrs = with_defaults("Resize", spec.attrs)  # a node built by hand may leave them out
    check_attrs(attrs)
    fixed = static_plan(spec)

    def run(x: np.ndarray, roi: np.ndarray | None = None, scales: np.ndarray | None = None,
            sizes: np.ndarray | None = None) -> np.ndarray:
        if fixed is not None:
            return resize(attrs, x, fixed)
        try:
            plan = resized_axes(attrs, x.shape, roi, scales, sizes)
        except VerifyError as exc:
            raise unsupported(spec, str(exc)) from None
        return resize(attrs, x, plan)

    return run


def static_plan(spec: KernelSpec) -> list[AxisResize] | None:
    """The plan fixed at build time (static X, constant roi, scales and sizes), or None."""
    static = spec.in_types[0].is_static and all(
        spec.const_array(i) is not None for i in range(1, len(spec.in_types)) if spec.in_types[i] is not None)
    attrs = with_defaults("Resize", spec.attrs)
    return resized_axes(attrs, spec.in_types[0].shape, *_optional(spec.const_array, len(spec.in_types))) \
        if static else None


def _optional(const: Callable[[int], np.ndarray | None], count: int) -> list[np.ndarray | None]:
    """roi, scales and sizes as arrays (None where absent)."""
    return [const(i) if i < count else None for i in range(1, 4)]

