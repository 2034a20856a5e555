"""Core ATen -> tilefold ops, continued (see fx_ops.py): linear algebra, convolution,
normalizations, softmax, pooling and reductions. Importing this module adds its rules to
`fx_ops.RULES`."""
from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np
import torch
import torch.fx

from ..graph.types import Splat, Value
from .fx_emit import Emitter, arg, out_val, torch_to_numpy_dtype
from .fx_ops import _dims, _rank, aten, rule

# ---- linear algebra and nn -----------------------------------------------------------------
@rule(aten.mm.default, aten.matmul.default)
def _matmul(emit: Emitter, node: torch.fx.Node) -> Value:
    return emit.op("MatMul", [emit.value(node.args[0]), emit.value(node.args[1])], node=node)


_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _batched_source(x: torch.fx.Node) -> torch.fx.Node | None:
    """For a bmm operand `view(t, [B, m, k])` where t is [b1, .., bj, m, k] with B = b1*..*bj:
    t (decomposition flattens the batch dims of a batched matmul; MatMul takes them as they are)."""
    if x.target not in _VIEWS:
        return None
    source = x.args[0]
    flat, full = tuple(x.meta["val"].shape), tuple(source.meta["val"].shape)
    if len(full) < 3 or full[-2:] != flat[-2:] or int(np.prod(full[:-2])) != flat[0]:
        return None
    return source


@rule(aten.bmm.default)
def _bmm(emit: Emitter, node: torch.fx.Node) -> Value:
    a, b = (_batched_source(x) for x in node.args[:2])
    if a is None or b is None or tuple(a.meta["val"].shape[:-2]) != tuple(b.meta["val"].shape[:-2]):
        return emit.op("MatMul", [emit.value(node.args[0]), emit.value(node.args[1])], node=node)
    product = emit.op("MatMul", [emit.value(a), emit.value(b)])
    return emit.op("Reshape", [product, emit.ints(out_val(node).shape)], node=node)


@rule(aten.addmm.default)
def _addmm(emit: Emitter, node: torch.fx.Node) -> Value:
    beta, alpha = float(node.kwargs.get("beta", 1)), float(node.kwargs.get("alpha", 1))
    inputs = [emit.value(node.args[1]), emit.value(node.args[2]), emit.value(node.args[0])]
    return emit.op("Gemm", inputs, {"alpha": alpha, "beta": beta}, node=node)


def _conv_check(node: torch.fx.Node) -> str | None:
    return None if node.args[0].meta["val"].dim() in (3, 4, 5) else "unbatched input"


@rule(aten.convolution.default, check=_conv_check)
def _convolution(emit: Emitter, node: torch.fx.Node) -> Value:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args
    spatial = w.meta["val"].dim() - 2
    attrs = {"kernel_shape": tuple(int(d) for d in w.meta["val"].shape[2:]),
             "strides": tuple(_spread(stride, spatial)), "pads": tuple(_spread(padding, spatial) * 2),
             "dilations": tuple(_spread(dilation, spatial)), "group": int(groups)}
    inputs = [emit.value(x), emit.value(w)] + ([emit.value(b)] if b is not None else [])
    if transposed:  # torch's weight is (C, F/groups, *k), as ONNX's
        attrs["output_padding"] = tuple(_spread(output_padding, spatial))
        return emit.op("ConvTranspose", inputs, attrs, node=node)
    return emit.op("Conv", inputs, attrs, node=node)


def _spread(values: Any, n: int) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    return [int(v) for v in (values * n if len(values) == 1 else values)]


@rule(aten.native_layer_norm.default)
def _layer_norm(emit: Emitter, node: torch.fx.Node) -> tuple[Value, ...]:
    x, shape, weight, bias, eps = node.args
    val = out_val(node)[0]
    norm_shape = tuple(int(d) for d in shape)
    dtype = torch_to_numpy_dtype(val.dtype)
    scale = emit.value(weight) if weight is not None else emit.constant(Splat(1, norm_shape, dtype))
    shift = emit.value(bias) if bias is not None else emit.constant(Splat(0, norm_shape, dtype))
    attrs = {"axis": -len(norm_shape), "epsilon": float(eps)}
    used = 1 + max((u.args[1] for u in node.users if u.target is operator.getitem), default=0)
    results = emit.op("LayerNormalization", [emit.value(x), scale, shift], attrs, node=node, n_out=used,
                      result=0 if used == 1 else None)
    return (results,) if used == 1 else results


def _only_first_result(node: torch.fx.Node) -> str | None:
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    return None if used <= {0} and all(u.target is operator.getitem for u in node.users) else \
        "its second or third result"


@rule(aten._native_batch_norm_legit_no_training.default, check=_only_first_result)
def _batch_norm(emit: Emitter, node: torch.fx.Node) -> tuple[Value | None, ...]:
    x, weight, bias, mean, var, _, eps = node.args
    channels = (int(x.meta["val"].shape[1]),)
    dtype = torch_to_numpy_dtype(out_val(node)[0].dtype)
    scale = emit.value(weight) if weight is not None else emit.constant(Splat(1, channels, dtype))
    shift = emit.value(bias) if bias is not None else emit.constant(Splat(0, channels, dtype))
    inputs = [emit.value(x), scale, shift, emit.value(mean), emit.value(var)]
    return (emit.op("BatchNormalization", inputs, {"epsilon": float(eps)}, node=node, result=0), None, None)


@rule(aten._softmax.default, aten._log_softmax.default,
      check=lambda n: None if not n.args[2] else "half_to_float")
def _softmax(emit: Emitter, node: torch.fx.Node) -> Value:
    op = "Softmax" if node.target == aten._softmax.default else "LogSoftmax"
    return emit.op(op, [emit.value(node.args[0])], {"axis": node.args[1] % max(_rank(node), 1)}, node=node)


def _pool_check(node: torch.fx.Node) -> str | None:
    if node.target == aten.max_pool2d_with_indices.default:
        return _only_first_result(node)
    return "divisor_override" if arg(node, 6, "divisor_override", None) is not None else None


@rule(aten.max_pool2d_with_indices.default, aten.avg_pool2d.default, check=_pool_check)
def _pool(emit: Emitter, node: torch.fx.Node) -> Value | tuple[Value | None, ...]:
    kernel = _spread(node.args[1], 2)
    stride = _spread(arg(node, 2, "stride", []) or kernel, 2)
    padding = _spread(arg(node, 3, "padding", 0), 2)
    attrs: dict[str, Any] = {"kernel_shape": tuple(kernel), "strides": tuple(stride), "pads": tuple(padding * 2)}
    x = emit.value(node.args[0])
    if node.target == aten.max_pool2d_with_indices.default:
        attrs.update(dilations=tuple(_spread(arg(node, 4, "dilation", 1), 2)),
                     ceil_mode=int(arg(node, 5, "ceil_mode", False)))
        return (emit.op("MaxPool", [x], attrs, node=node, result=0), None)
    attrs.update(ceil_mode=int(arg(node, 4, "ceil_mode", False)),
                 count_include_pad=int(arg(node, 5, "count_include_pad", True)))
    return emit.op("AveragePool", [x], attrs, node=node)


_ADAPTIVE = {aten._adaptive_avg_pool2d.default: 2, aten._adaptive_avg_pool3d.default: 3}
"""Adaptive average pooling -> its number of spatial (trailing) dims. 1-d pooling and
F.interpolate(mode="area") reach these too (torch unsqueezes a 1-d input to 2-d)."""


def _adaptive_check(node: torch.fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if any(not isinstance(d, int) for d in (*x.shape, *out_val(node).shape)):
        return "a symbolic size (the averaging windows are constants built at conversion)"
    return None if x.dtype.is_floating_point else "integer input"


def adaptive_windows(n_in: int, n_out: int) -> np.ndarray:
    """The (n_out, n_in) float64 matrix of torch's adaptive averaging along one axis: row i
    averages inputs floor(i * n_in / n_out) .. ceil((i + 1) * n_in / n_out) - 1 (windows that
    overlap when n_out does not divide n_in, and repeat inputs when n_out > n_in)."""
    i = np.arange(n_out)
    start, end = i * n_in // n_out, -(-(i + 1) * n_in // n_out)
    j = np.arange(n_in)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return inside / (end - start)[:, None]


@rule(*_ADAPTIVE, check=_adaptive_check)
def _adaptive_avg_pool(emit: Emitter, node: torch.fx.Node) -> Value:
    """1. A batched input whose output sizes divide its sizes: GlobalAveragePool (all 1) or
    AveragePool with kernel = stride = in / out, ops that layouts pass through.
    2. Otherwise (and unbatched): pooling is separable, Y = A_h X A_w^T (and A_d in 3-d), one
    MatMul per axis that changes with the constant `adaptive_windows` matrix: the last axis
    as X @ A^T, an inner one as A @ X with the dims after it folded into one (Reshape).
    float16 is averaged in float32 (Cast both ways), as torch accumulates it."""
    x = emit.value(node.args[0])
    shape = [int(d) for d in node.args[0].meta["val"].shape]
    first = len(shape) - _ADAPTIVE[node.target]  # the spatial dims trail (the input may be unbatched)
    size, out = shape[first:], [int(d) for d in out_val(node).shape[first:]]
    if first == 2 and all(s % o == 0 for s, o in zip(size, out)):  # case 1
        if all(o == 1 for o in out):
            return emit.op("GlobalAveragePool", [x], node=node)
        kernel = tuple(s // o for s, o in zip(size, out))
        attrs = {"kernel_shape": kernel, "strides": kernel, "pads": (0,) * (2 * len(kernel))}
        return emit.op("AveragePool", [x], attrs, node=node)
    dtype = torch_to_numpy_dtype(out_val(node).dtype)  # case 2
    compute = np.dtype(np.float32) if dtype == np.float16 else dtype
    x = emit.cast(x, compute)
    for axis in reversed(range(first, len(shape))):
        n_in, n_out = shape[axis], out[axis - first]
        if n_in == n_out:
            continue
        windows = adaptive_windows(n_in, n_out).astype(compute)
        if axis == len(shape) - 1:
            x = emit.op("MatMul", [x, emit.constant(np.ascontiguousarray(windows.T))])
        elif axis == len(shape) - 2:
            x = emit.op("MatMul", [emit.constant(windows), x])
        else:  # an empty batch's 0 in the shapes is Reshape's "copy this dim": also 0
            folded = emit.op("Reshape", [x, emit.ints([*shape[:axis], n_in, int(np.prod(shape[axis + 1:]))])])
            pooled = emit.op("MatMul", [emit.constant(windows), folded])
            x = emit.op("Reshape", [pooled, emit.ints([*shape[:axis], n_out, *shape[axis + 1:]])])
        shape[axis] = n_out
    return emit.op("Identity", [emit.cast(x, dtype)], node=node)


# ---- reductions ----------------------------------------------------------------------------
def _reduction(onnx_op: str, input_dtype: Callable[[torch.fx.Node], torch.dtype]):
    def convert(emit: Emitter, node: torch.fx.Node) -> Value:
        rank = _rank(node)
        dims = arg(node, 1, "dim", None)
        keep = bool(arg(node, 2, "keepdim", False))
        x = emit.tensor(node.args[0], input_dtype(node))
        if rank == 0:  # a 0-d tensor reduces to itself
            return emit.op("Identity", [x], node=node)
        inputs = [x] if dims is None or dims == [] else [x, emit.ints(_dims(dims, rank))]
        result = emit.op(onnx_op, inputs, {"keepdims": int(keep)}, node=node if rank else None)
        return result if rank else emit.op("Identity", [result], node=node)
    return convert


def _out_dtype(node: torch.fx.Node) -> torch.dtype:
    return out_val(node).dtype


def _reduce_float(node: torch.fx.Node) -> str | None:
    return None if out_val(node).dtype.is_floating_point else "an integer mean"


rule(aten.sum.dim_IntList)(_reduction("ReduceSum", _out_dtype))
rule(aten.mean.dim, check=_reduce_float)(_reduction("ReduceMean", _out_dtype))
rule(aten.amax.default)(_reduction("ReduceMax", _out_dtype))
rule(aten.amin.default)(_reduction("ReduceMin", _out_dtype))
rule(aten.any.dim, aten.any.dims)(_reduction("ReduceMax", lambda n: torch.bool))
rule(aten.all.dim, aten.all.dims)(_reduction("ReduceMin", lambda n: torch.bool))


@rule(aten.sum.default, aten.mean.default, aten.any.default, aten.all.default)
def _reduce_all(emit: Emitter, node: torch.fx.Node) -> Value:
    op = {aten.sum.default: "ReduceSum", aten.mean.default: "ReduceMean", aten.any.default: "ReduceMax",
          aten.all.default: "ReduceMin"}[node.target]
    dtype = torch.bool if op in ("ReduceMax", "ReduceMin") else out_val(node).dtype
    if _rank(node) == 0:
        return emit.op("Identity", [emit.tensor(node.args[0], dtype)], node=node)
    return emit.op(op, [emit.tensor(node.args[0], dtype)], {"keepdims": 0}, node=node)


@rule(aten.argmax.default, aten.argmin.default)
def _argmax(emit: Emitter, node: torch.fx.Node) -> Value:
    op = "ArgMax" if node.target == aten.argmax.default else "ArgMin"
    dim, keep = arg(node, 1, "dim", None), bool(arg(node, 2, "keepdim", False))
    x = emit.value(node.args[0])
    if dim is None:
        x, dim = emit.op("Reshape", [x, emit.ints([-1])]), 0
        result = emit.op(op, [x], {"axis": 0, "keepdims": 0})
        return emit.op("Reshape", [result, emit.ints(out_val(node).shape)], node=node)
    return emit.op(op, [x], {"axis": dim % max(_rank(node), 1), "keepdims": int(keep)}, node=node)


@rule(aten.max.dim, aten.min.dim, check=lambda n: None if _rank(n) else "a 0-d input")
def _max_dim(emit: Emitter, node: torch.fx.Node) -> tuple[Value, Value]:
    """The values (ReduceMax) and the indices of the first extreme (ArgMax), as torch returns."""
    largest = node.target == aten.max.dim
    dim, keep = node.args[1] % _rank(node), int(arg(node, 2, "keepdim", False))
    x = emit.value(node.args[0])
    values = emit.op("ReduceMax" if largest else "ReduceMin", [x, emit.ints([dim])], {"keepdims": keep},
                     node=node, result=0)
    indices = emit.op("ArgMax" if largest else "ArgMin", [x], {"axis": dim, "keepdims": keep}, node=node, result=1)
    return values, indices


@rule(aten.topk.default, check=lambda n: None if _rank(n) else "a 0-d input")
def _topk(emit: Emitter, node: torch.fx.Node) -> tuple[Value, ...]:
    """TopK, always sorted (torch's sorted=False leaves the order unspecified)."""
    dim = arg(node, 2, "dim", -1) % _rank(node)
    largest = int(arg(node, 3, "largest", True))
    inputs = [emit.value(node.args[0]), emit.ints([int(node.args[1])])]
    return emit.op("TopK", inputs, {"axis": dim, "largest": largest, "sorted": 1}, node=node, n_out=2)


def _sortable(node: torch.fx.Node) -> str | None:
    if not _rank(node):
        return "a 0-d input"
    return "a bool input" if node.args[0].meta["val"].dtype == torch.bool else None


@rule(aten.sort.default, aten.sort.stable, check=_sortable)
def _sort(emit: Emitter, node: torch.fx.Node) -> tuple[Value, ...]:
    """TopK of the whole dim, sorted: equal values keep their index order (ONNX TopK's rule),
    which is torch's stable order, and a valid order for its unstable sort."""
    rank = _rank(node)
    dim = arg(node, 1, "dim", -1) % rank
    descending = int(bool(arg(node, 2, "descending", False)))
    size = node.args[0].meta["val"].shape[dim]
    inputs = [emit.value(node.args[0]), emit.ints([int(size)])]
    return emit.op("TopK", inputs, {"axis": dim, "largest": descending, "sorted": 1}, node=node, n_out=2)


@rule(aten.cumsum.default)
def _cumsum(emit: Emitter, node: torch.fx.Node) -> Value:
    x = emit.tensor(node.args[0], out_val(node).dtype)  # torch sums integers and bools as int64
    return emit.op("CumSum", [x, emit.ints([int(arg(node, 1, "dim", 0)) % max(_rank(node), 1)])], node=node)


def _float_variance(node: torch.fx.Node) -> str | None:
    return None if node.args[0].meta["val"].dtype.is_floating_point else "integer input"


@rule(aten.var_mean.correction, aten.var.correction, check=_float_variance)
def _variance(emit: Emitter, node: torch.fx.Node) -> Value | tuple[Value, Value]:
    """var = sum((x - mean)^2) / max(0, n - correction) over dims, as torch (0/0 gives NaN)."""
    rank = _rank(node)
    dims = _dims(arg(node, 1, "dim", None) or None, rank)
    correction = node.kwargs.get("correction")  # keyword-only in both overloads; None means 1
    correction = 1 if correction is None else float(correction)
    keep = bool(node.kwargs.get("keepdim", False))
    is_pair = node.target == aten.var_mean.correction
    x = emit.value(node.args[0])
    shape = node.args[0].meta["val"].shape
    count = int(np.prod([int(shape[d]) for d in dims])) if rank else 1
    dtype = (out_val(node)[0] if is_pair else out_val(node)).dtype
    axes = [emit.ints(dims)] if rank else []
    mean = emit.op("ReduceMean", [x, *axes], {"keepdims": 1})
    centered = emit.op("Sub", [x, mean])
    squares = emit.op("ReduceSum", [emit.op("Mul", [centered, centered]), *axes], {"keepdims": int(keep)})
    var = emit.op("Div", [squares, emit.scalar(max(0.0, count - correction), dtype)],
                  node=None if is_pair else node)
    if not is_pair:
        return var
    kept = out_val(node)[1].shape
    return var, emit.op("Reshape", [mean, emit.ints([int(d) for d in kept])])


def _as_strided_check(node: torch.fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if not x.is_contiguous() or x.storage_offset() != 0:
        return "a view of a non-contiguous tensor"
    size, stride = node.args[1], node.args[2]
    offset = int(arg(node, 3, "storage_offset", None) or 0)
    last = offset + sum((int(n) - 1) * int(s) for n, s in zip(size, stride) if int(n) > 0)
    return None if last < max(x.numel(), 1) else "elements beyond the tensor's own"


@rule(aten.as_strided.default, check=_as_strided_check)
def _as_strided(emit: Emitter, node: torch.fx.Node) -> Value:
    """A strided view of a contiguous tensor: a Reshape when the view is its elements in
    order, else a Gather of the flat elements at the view's (constant) storage indices."""
    x = node.args[0].meta["val"]
    size = [int(n) for n in node.args[1]]
    stride = [int(s) for s in node.args[2]]
    offset = int(arg(node, 3, "storage_offset", None) or 0)
    index = np.full(size, offset, np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        index += (np.arange(n, dtype=np.int64) * s).reshape([n if k == d else 1 for k in range(len(size))])
    if index.size == x.numel() and np.array_equal(index.reshape(-1), np.arange(index.size)):
        return emit.op("Reshape", [emit.value(node.args[0]), emit.ints(size)], node=node)
    flat = emit.op("Reshape", [emit.value(node.args[0]), emit.ints([-1])])
    return emit.op("Gather", [flat, emit.constant(index)], {"axis": 0}, node=node)


# ---- resampling ----------------------------------------------------------------------------
_NEAREST: dict[Any, bool] = {
    aten.upsample_nearest1d: False, aten.upsample_nearest2d: False, aten.upsample_nearest3d: False,
    aten._upsample_nearest_exact1d: True, aten._upsample_nearest_exact2d: True,
    aten._upsample_nearest_exact3d: True,
}
"""ATen nearest resampling op -> whether it is nearest-exact (see `nearest_source`)."""

_RESAMPLE: dict[Any, dict[str, Any]] = {
    aten.upsample_linear1d: {"mode": "linear"}, aten.upsample_bilinear2d: {"mode": "linear"},
    aten.upsample_trilinear3d: {"mode": "linear"}, aten.upsample_bicubic2d: {"mode": "cubic"},
    aten._upsample_bilinear2d_aa: {"mode": "linear", "antialias": 1, "exclude_outside": 1},
    aten._upsample_bicubic2d_aa: {"mode": "cubic", "antialias": 1, "exclude_outside": 1, "cubic_coeff_a": -0.5},
}
"""ATen resampling op -> Resize attributes. torch maps output index i to (i + 0.5) / scale - 0.5
(half_pixel, Resize's default; torch clamps a negative linear source to 0, which equals
Resize's clamped taps), or i (in - 1) / (out - 1) under align_corners. The antialiased (`_aa`) kernels
leave taps outside the input out and renormalize (exclude_outside), and their bicubic
filter is PIL's (a = -0.5)."""


def _resample_args(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name (output_size, align_corners, and scale_factors
    or scales / scales_d, scales_h, scales_w), defaults filled in."""
    return {a.name: node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value)
            for i, a in enumerate(node.target._schema.arguments)}


def _resample_check(node: torch.fx.Node) -> str | None:
    aa = node.target.overloadpacket in (aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa)
    return "antialiased resampling with align_corners" if aa and _resample_args(node).get("align_corners") else None


def _axis_scales(args: dict[str, Any], count: int) -> list[float | None]:
    """Each spatial axis's scale factor as torch received it (None: it uses in / out)."""
    if "scale_factors" in args:
        given = args["scale_factors"]
        return [None] * count if given is None else [float(s) for s in given]
    return [None if args[k] is None else float(args[k]) for k in ("scales", "scales_d", "scales_h", "scales_w")
            if k in args]


def nearest_source(n_in: int, n_out: int, scale: float | None, exact: bool) -> np.ndarray:
    """torch's nearest (or nearest-exact) source index of every output position along one
    axis, in its own float32 arithmetic: floorf(i * s) or floorf((i + 0.5) * s) with
    s = float(1 / scale) when a scale factor was given, else float(in) / out. Resize, which
    divides by its float32 scale, differs at whole-number boundaries (11 / float32(1.1) is
    just below 10, torch's 11 * float(1 / 1.1) just above), so nearest resampling is emitted
    as gathers of these."""
    i = np.arange(n_out)
    if not exact and (n_out == n_in or n_out == 2 * n_in):
        return i * n_in // n_out
    s = np.float32(1.0 / scale) if scale is not None and scale > 0 else np.float32(n_in) / np.float32(n_out)
    if exact:
        src = np.floor(((i + 0.5) * np.float64(s)).astype(np.float32))
    else:
        src = np.floor(i.astype(np.float32) * s)
    return np.minimum(src.astype(np.int64), n_in - 1)


def _nearest(emit: Emitter, node: torch.fx.Node, args: dict[str, Any], exact: bool) -> Value:
    """One Gather per spatial axis that changes, with torch's own source indices."""
    shape_in, shape_out = out_val(node.args[0]).shape, out_val(node).shape
    spatial = range(2, len(shape_out))
    x = emit.value(node.args[0])
    for axis, scale in zip(spatial, _axis_scales(args, len(spatial))):
        index = nearest_source(int(shape_in[axis]), int(shape_out[axis]), scale, exact)
        if not np.array_equal(index, np.arange(int(shape_in[axis]))):
            x = emit.op("Gather", [x, emit.constant(index)], {"axis": axis})
    return emit.op("Identity", [x], node=node)


def _resample(emit: Emitter, node: torch.fx.Node) -> Value:
    """Resize over the spatial dims: with torch's own scale factors when it maps coordinates
    with them, else with the traced output sizes; nearest modes as gathers (`nearest_source`)."""
    args = _resample_args(node)
    packet = node.target.overloadpacket
    if packet in _NEAREST:
        return _nearest(emit, node, args, exact=_NEAREST[packet])
    attrs = dict(_RESAMPLE[packet])
    if args.get("align_corners"):
        attrs["coordinate_transformation_mode"] = "align_corners"
    x = emit.value(node.args[0])
    scales = None if args.get("align_corners") else _axis_scales(args, len(out_val(node).shape) - 2)
    if scales is not None and None in scales:  # torch then maps with in / out: Resize's sizes
        scales = None
    if scales is not None and packet is not aten.upsample_bicubic2d:
        # torch's linear and antialiased kernels copy an axis whose size does not change,
        # whatever its scale factor; plain bicubic maps it with the scale
        sizes = zip(out_val(node.args[0]).shape[2:], out_val(node).shape[2:])
        scales = [1.0 if n_in == n_out else s for s, (n_in, n_out) in zip(scales, sizes)]
    if scales is not None:
        return emit.op("Resize", [x, None, emit.constant(np.array([1, 1, *scales], np.float32))], attrs, node=node)
    return emit.op("Resize", [x, None, None, emit.ints(out_val(node).shape)], attrs, node=node)


RESAMPLING = tuple(getattr(packet, overload) for packet in (*_NEAREST, *_RESAMPLE) for overload in ("default", "vec"))
"""The resampling ops the rules above convert, each into one Resize or one Gather per axis,
which layouts pass through; PyTorch's core ATen table would decompose some of them into
index arithmetic and multi-dimensional gathers (16 GatherND for a bicubic upsampling)."""
rule(*RESAMPLING, check=_resample_check)(_resample)
