"""Resize (opset-21 semantics; the ONNX frontend converts older Resize and Upsample to it).

Inputs X, roi, scales, sizes; roi, scales and sizes are optional, and an empty tensor counts
as absent. Exactly one of scales and sizes decides the result's extents along `axes` (all
dims when the attribute is absent):
1. scales: extent floor(d * scale) (the float32 product, as onnx shape inference and
   onnxruntime compute it), and the coordinate mapping uses the scale as given;
2. sizes with keep_aspect_ratio_policy "stretch": the sizes, with scale size / d;
3. sizes with "not_larger" / "not_smaller": one scale for all listed axes, the smallest /
   largest size / d, and extents round-half-up(scale * d).
roi matters only to coordinate_transformation_mode tf_crop_and_resize, which needs one
(starts then ends, 2 * len(axes) values).

Its iteration signature, when roi, scales and sizes are constants: the axes it resamples
are window dims (never tiled), every axis it leaves as it is (scale 1, whole roi) is
parallel, so that channels-last or channel-tiled layouts pass through an upsampling.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import VerifyError
from ..registry import OpDef, register
from ..signature import LETTERS, Signature
from ..types import ConstValue, Dim, TensorType, as_array
from .shapes import dim_mul, fmt_shape, fresh, norm_axes

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class AxisResize:
    """How one axis is resized: its result extent, the scale the coordinate mapping divides
    by, and its (start, end) region of interest (tf_crop_and_resize only)."""

    axis: int
    size: int
    scale: float
    roi: tuple[float, float] = (0.0, 1.0)


def _given(value: np.ndarray | None) -> np.ndarray | None:
    return None if value is None or value.size == 0 else value.reshape(-1)


def check_attrs(attrs: dict[str, Any]) -> None:
    """VerifyError for an attribute value outside Resize's enumerations."""
    for name, allowed in (("mode", MODES), ("coordinate_transformation_mode", COORDINATE_MODES),
                          ("nearest_mode", NEAREST_MODES), ("keep_aspect_ratio_policy", ASPECT_POLICIES)):
        if attrs[name] not in allowed:
            raise VerifyError(f"Resize: unknown {name} {attrs[name]!r} (one of {', '.join(allowed)})")


def resized_axes(attrs: dict[str, Any], shape: Sequence[int], roi: np.ndarray | None,
                 scales: np.ndarray | None, sizes: np.ndarray | None) -> list[AxisResize]:
    """Every axis Resize maps (the module docstring's cases), in the order `axes` lists them,
    from the input's static shape and the roi, scales and sizes values (None: absent)."""
    rank = len(shape)
    axes = norm_axes(attrs["axes"], rank, "Resize") if attrs.get("axes") else list(range(rank))
    roi, scales, sizes = _given(roi), _given(scales), _given(sizes)
    if (scales is None) == (sizes is None):
        raise VerifyError(f"Resize: give exactly one of scales and sizes for X [{fmt_shape(shape)}], "
                          f"got {'both' if scales is not None else 'neither'}")
    given = scales if scales is not None else sizes
    if len(given) != len(axes):
        raise VerifyError(f"Resize: {'scales' if scales is not None else 'sizes'} {given.tolist()} must hold "
                          f"{len(axes)} values for X [{fmt_shape(shape)}] and axes {axes}")
    crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    if crop and (roi is None or len(roi) != 2 * len(axes)):
        raise VerifyError(f"Resize: tf_crop_and_resize needs a roi of {2 * len(axes)} values "
                          f"(starts, ends) for axes {axes}, got {None if roi is None else roi.tolist()}")
    spans = [(float(roi[i]), float(roi[len(axes) + i])) if crop else (0.0, 1.0) for i in range(len(axes))]
    dims = [int(shape[a]) for a in axes]
    if scales is not None:
        if any(s <= 0 for s in scales):
            raise VerifyError(f"Resize: scales {scales.tolist()} must be positive")
        factors = [float(s) for s in scales]
        extents = [int(math.floor(np.float32(d) * np.float32(s))) for d, s in zip(dims, scales)]
    else:
        if any(s < 0 for s in sizes):
            raise VerifyError(f"Resize: sizes {sizes.tolist()} must not be negative")
        extents = [int(s) for s in sizes]
        factors = [s / d if d else 1.0 for s, d in zip(extents, dims)]
        policy = attrs["keep_aspect_ratio_policy"]
        if policy != "stretch":
            common = min(factors) if policy == "not_larger" else max(factors)
            factors = [common] * len(dims)
            extents = [int(common * d + 0.5) for d in dims]
    return [AxisResize(a, n, f, span) for a, n, f, span in zip(axes, extents, factors, spans)]


def _const(consts: Sequence[ConstValue | None], types: Sequence[TensorType | None], i: int) -> np.ndarray | None:
    if i >= len(types) or types[i] is None:
        return None
    value = consts[i] if i < len(consts) else None
    return None if value is None else np.asarray(as_array(value))


def _absent(t: TensorType | None) -> bool:
    return t is None or t.numel() == 0


def _symbolic_extent(dim: Dim, r: AxisResize, by_scale: bool, attrs: dict[str, Any]) -> Dim:
    """The extent along an axis whose input dim may be a symbol: exact for a static dim, for
    sizes under "stretch", and for whole-number scales (dim * scale); fresh otherwise."""
    if isinstance(dim, int) or (not by_scale and attrs["keep_aspect_ratio_policy"] == "stretch"):
        return r.size
    if by_scale and float(r.scale).is_integer():
        return dim_mul(dim, int(r.scale))
    return fresh("Resize", r.axis)


def _resize_infer(attrs, types, consts):
    x = types[0]
    check_attrs(attrs)
    types = list(types) + [None] * (4 - len(types))
    scales_t, sizes_t = types[2], types[3]
    if not _absent(scales_t) and not _absent(sizes_t) and scales_t.numel() is not None and sizes_t.numel() is not None:
        raise VerifyError(f"Resize: give exactly one of scales {scales_t} and sizes {sizes_t} for X {x}, not both")
    if _absent(scales_t) and _absent(sizes_t):
        raise VerifyError(f"Resize: X {x} needs scales or sizes, got neither")
    if not _absent(scales_t) and scales_t.dtype.kind != "f":
        raise VerifyError(f"Resize: scales {scales_t} must be floating point")
    if not _absent(sizes_t) and sizes_t.dtype != np.dtype(np.int64):
        raise VerifyError(f"Resize: sizes {sizes_t} must be int64")
    axes = norm_axes(attrs["axes"], x.rank, "Resize") if attrs.get("axes") else list(range(x.rank))
    scales, sizes = _const(consts, types, 2), _const(consts, types, 3)
    known = (scales if not _absent(scales_t) else sizes) is not None
    roi = _const(consts, types, 1)
    needs_roi = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    if known and (not needs_roi or roi is not None):
        shape = [d if isinstance(d, int) else 1 for d in x.shape]
        out: list[Dim] = list(x.shape)
        for r in resized_axes(attrs, shape, roi, scales, sizes):
            out[r.axis] = _symbolic_extent(x.shape[r.axis], r, scales is not None, attrs)
        return [TensorType(tuple(out), x.dtype)]
    if known:  # only the roi is unknown: still check the lengths
        resized_axes({**attrs, "coordinate_transformation_mode": "asymmetric"},
                     [d if isinstance(d, int) else 1 for d in x.shape], None, scales, sizes)
    return [TensorType(tuple(fresh("Resize", a) if a in axes else d for a, d in enumerate(x.shape)), x.dtype)]


def unchanged(r: AxisResize) -> bool:
    """Whether the resize leaves this axis as it is (kernels skip it)."""
    return r.scale == 1 and r.roi == (0.0, 1.0)


def _resize_signature(attrs, types, outs, consts=None):
    """X's dims, the resampled ones window dims (see the module docstring); None unless the
    plan is known: constant roi, scales or sizes, and static extents along axes given sizes."""
    x, count = types[0], len(types)
    types = list(types) + [None] * (4 - count)
    consts = list(consts or ()) + [None] * 4
    check_attrs(attrs)
    roi, scales, sizes = (_const(consts, types, i) for i in (1, 2, 3))
    scales = None if _absent(types[2]) else scales
    sizes = None if _absent(types[3]) else sizes
    if (scales is None) == (sizes is None) or (attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
                                               and roi is None):
        return None
    if sizes is not None and not x.is_static:
        return None
    shape = [d if isinstance(d, int) else 1 for d in x.shape]  # under scales the extent does not matter
    try:
        plan = resized_axes(attrs, shape, roi, scales, sizes)
    except VerifyError:
        return None
    letters = tuple(LETTERS[: x.rank])
    window = {letters[r.axis]: "window" for r in plan if not unchanged(r)}
    return Signature((letters,) + (None,) * (count - 1), (letters,), window)


register(OpDef(
    "Resize", infer=_resize_infer, signature=_resize_signature, layout="sensitive", min_inputs=1, max_inputs=4,
    defaults={"antialias": 0, "coordinate_transformation_mode": "half_pixel",
              "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0,
              "keep_aspect_ratio_policy": "stretch", "mode": "nearest", "nearest_mode": "round_prefer_floor"},
    doc="Nearest, n-linear or cubic resampling of X along `axes`; see the module docstring "
        "for how scales or sizes decide the result shape.",
))
