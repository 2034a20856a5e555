"""Every template compiles for a GPU without one: Triton's full pipeline (TTIR, TTGIR, LLVM IR,
PTX, cubin through the bundled ptxas) for sm_90 and sm_80, from the generated sources of
small models and of the dtype and op variants (bool and integer chains, the narrow and
unsigned integers, float16, pools, gathers (GatherND too), resizes, splits into several
results, pads in every mode, bool reductions, scans, the float64 helpers of libm.py,
remainders, bits and products, OneHot, TopK of every dtype it takes and of a row read in
pieces, scatters by store, by atomics and by compare-and-swap on 16- and 32-bit words, a
quantized conv stack's QuantizeLinear/DequantizeLinear in conv epilogues, flash attention
in float16 and bfloat16 (and on operands it upcasts and scales), layer norms as matmul
prologues, and a matmul's paired column parts). This catches what the interpreter accepts and the compiler does not."""
from __future__ import annotations

import numpy as np
import pytest

import tilefold
from tilefold.backends.triton.aot import compile_for_cuda
from tilefold.bench.models import mlp_model, qdq_cnn_model
from tilefold.graph import Graph
from tilefold.graph.types import Splat, TensorType, Value
from tilefold.layout.encoding import PackedEncoding

ACT = PackedEncoding((1,), (16,))


def _variants(kit) -> Graph:
    """One graph with the dtype and op variants the models do not have."""
    g = Graph("variants")
    x = g.add_input("x", TensorType((2, 18, 9, 8), np.float32))
    h = g.add_input("h", TensorType((20, 64), np.float16))
    ids = g.add_input("ids", TensorType((3,), np.int64))
    xp = kit.add(g, "Pack", [x], {"encoding": ACT}, encoding=ACT)
    pooled = kit.add(g, "MaxPool", [xp], {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 1, 1, 1)},
                     encoding=ACT.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [kit.add(g, "Relu", [pooled], encoding=ACT.with_pad(None))]), "pooled")
    avg = kit.add(g, "AveragePool", [x], {"kernel_shape": (2, 2), "count_include_pad": 1, "pads": (1, 1, 0, 0)})
    g.add_output(avg, "avg")
    zero = g.add_constant(Splat(0.0, (), np.float32), name="zero")
    keep = kit.add(g, "And", [kit.add(g, "Not", [kit.add(g, "IsNaN", [x])]), kit.add(g, "Greater", [x, zero])])
    g.add_output(kit.add(g, "Where", [keep, x, zero]), "masked")
    g.add_output(keep, "keep")
    w = g.add_constant(np.random.default_rng(0).standard_normal((64, 18)).astype(np.float16), name="w")
    mm = kit.add(g, "MatMul", [h, w])
    g.add_output(kit.add(g, "Cast", [kit.add(g, "Sigmoid", [mm])], {"to": 1}), "half")
    table = g.add_constant(np.random.default_rng(1).standard_normal((11, 7)).astype(np.float32), name="table")
    g.add_output(kit.add(g, "Gather", [table, ids], {"axis": 0}), "rows")
    g.add_output(kit.add(g, "Cast", [ids], {"to": 9}), "nonzero")
    one = g.add_constant(Splat(1, (), np.int64), name="one_id")
    doubled = kit.add(g, "Where", [kit.add(g, "Equal", [ids, one]), one, kit.add(g, "Add", [ids, ids])])
    int_ids = kit.add(g, "Cast", [kit.add(g, "Concat", [doubled, ids], {"axis": 0})], {"to": 6})
    g.add_output(int_ids, "int_ids")
    shifts = g.add_constant(np.array([0, 3, 31, 40, -2, 5], np.int32), name="shifts")
    sevens = g.add_constant(np.array([7, -7, 0, -1, 3, 2], np.int32), name="sevens")
    g.add_output(kit.add(g, "Mod", [kit.add(g, "BitShift", [int_ids, shifts], {"direction": "RIGHT"}), sevens]),
                 "int32_bits")
    mask = g.add_constant(Splat(0x0F0F, (), np.int64), name="mask")
    two = g.add_constant(np.array([2, 70, -1], np.int64), name="two")
    bits = kit.add(g, "BitwiseXor", [kit.add(g, "BitwiseOr", [kit.add(g, "BitwiseAnd", [ids, mask]),
                                                                kit.add(g, "BitwiseNot", [ids])]),
                                     kit.add(g, "BitShift", [ids, two], {"direction": "LEFT"})])
    g.add_output(kit.add(g, "Mod", [bits, two], {"fmod": 1}), "int64_bits")
    g.add_output(kit.add(g, "CastLike", [ids, x]), "ids_like_x")
    g.add_output(kit.add(g, "CastLike", [x, h]), "x_like_h")
    t = kit.add(g, "Tanh", [x])
    inverse = t
    for op in ("Asin", "Sinh", "Asinh", "Atan"):
        inverse = kit.add(g, op, [inverse])
    g.add_output(inverse, "inverse")
    angle = t
    for op in ("Acos", "Tan", "Cosh", "Acosh"):
        angle = kit.add(g, op, [angle])
    g.add_output(angle, "angle")
    g.add_output(kit.add(g, "Atanh", [t]), "atanh")
    divisor = g.add_constant(np.array([2.5, -2.5, 0.3, -0.3, 1e-3, 7.0, -1.0, 0.0], np.float32), name="divisor")
    g.add_output(kit.add(g, "Round", [kit.add(g, "Mod", [x, divisor], {"fmod": 1})]), "fmod")
    g.add_output(kit.add(g, "Mod", [x, divisor], {"fmod": 0}), "mod")
    prod_axes = g.add_constant(np.array([3], np.int64), name="prod_axes")
    g.add_output(kit.add(g, "ReduceProd", [x, prod_axes], {"keepdims": 0}), "prod")
    zero_axis = g.add_constant(np.array(0, np.int64), name="zero_axis")
    g.add_output(kit.add(g, "CumSum", [doubled, zero_axis], {"exclusive": 1, "reverse": 1}), "positions")
    g.add_output(kit.add(g, "ArgMax", [x], {"axis": 1, "keepdims": 0, "select_last_index": 1}), "argmax")
    g.add_output(kit.add(g, "ArgMin", [doubled], {"axis": 0}), "argmin")
    lse_axes = g.add_constant(np.array([2], np.int64), name="lse_axes")
    g.add_output(kit.add(g, "ReduceLogSumExp", [x, lse_axes]), "lse")
    g.add_output(kit.add(g, "Unpack", [kit.add(g, "GlobalMaxPool", [xp], encoding=ACT.with_pad(None))]), "gmax")
    slope = g.add_constant(np.full((18, 1, 1), 0.1, np.float32), name="slope")
    g.add_output(kit.add(g, "Sign", [kit.add(g, "PRelu", [kit.add(g, "Mean", [x, avg, x]), slope])]), "prelu")
    d2s = kit.add(g, "DepthToSpace", [x], {"blocksize": 3, "mode": "CRD"})
    g.add_output(kit.add(g, "SpaceToDepth", [d2s], {"blocksize": 3}), "s2d")
    tiled = kit.add(g, "Tile", [ids, g.add_constant(np.array([3], np.int64), name="reps")])
    row = kit.add(g, "Unsqueeze", [tiled, g.add_constant(np.array([0], np.int64), name="row")])
    g.add_output(kit.add(g, "Trilu", [row], {"upper": 0}), "tril")
    wt = g.add_constant(np.random.default_rng(3).standard_normal((18, 3, 3, 3)).astype(np.float32), name="wt")
    g.add_output(kit.add(g, "ConvTranspose", [x, wt], {"group": 3, "strides": (2, 2), "pads": (1, 1, 1, 1),
                                                       "output_padding": (1, 0)}), "deconv")
    per_channel = g.add_constant(np.linspace(0.5, 2, 18, dtype=np.float32), name="per_channel")
    g.add_output(kit.add(g, "InstanceNormalization", [x, per_channel, per_channel]), "instance_norm")
    picks = g.add_constant(np.array([[0, 2], [1, -1]], np.int64), name="picks")
    g.add_output(kit.add(g, "GatherElements", [table, picks], {"axis": 1}), "elements")
    pairs = g.add_constant(np.array([[[1, -2], [0, 5]], [[17, -9], [3, 8]]], np.int64), name="pairs")
    g.add_output(kit.add(g, "GatherND", [x, pairs], {"batch_dims": 1}), "gather_nd")
    g.add_output(kit.add(g, "GatherND", [keep, g.add_constant(np.array([1, 2, 3, 4], np.int64), name="one")]),
                 "gather_nd_one")
    cls = kit.add(g, "Gather", [table, g.add_constant(np.array(-1, np.int64), name="last")], {"axis": 0})
    g.add_output(kit.add(g, "Tanh", [cls]), "cls")
    chain = kit.add(g, "ThresholdedRelu", [x], {"alpha": -0.5})
    for op in ("Selu", "Celu", "Softsign", "Mish"):
        chain = kit.add(g, op, [chain])
    g.add_output(chain, "activations")
    axes = g.add_constant(np.array([1, 3], np.int64), name="axes")
    g.add_output(kit.add(g, "ReduceMax", [x, axes], {"keepdims": 0}), "rmax")
    g.add_output(kit.add(g, "LogSoftmax", [x], {"axis": 1}), "logsm")
    wc = g.add_constant(np.random.default_rng(2).standard_normal((6, 9, 3, 3)).astype(np.float32), name="wc")
    g.add_output(kit.add(g, "Conv", [x, wc], {"group": 2, "strides": (2, 1), "dilations": (1, 2)}), "conv")
    g.add_output(kit.add(g, "Concat", [x, avg], {"axis": 3}), "joined")
    to = g.add_constant(np.array([4, 7], np.int64), name="to")
    g.add_output(kit.add(g, "Neg", [kit.add(g, "Expand", [cls, to])]), "expanded")
    starts, axes = (g.add_constant(np.array(v, np.int64), name=n) for n, v in (("starts", [-1]), ("sl_axes", [2])))
    steps = g.add_constant(np.array([-2], np.int64), name="steps")
    g.add_output(kit.add(g, "Slice", [x, starts, g.add_constant(np.array([-100], np.int64), name="ends"), axes,
                                      steps]), "sliced")
    roi = g.add_constant(np.array([0, 0, -0.2, 0, 1, 1, 1.2, 1], np.float32), name="roi")
    grow = g.add_constant(np.array([1, 1, 1.5, 1.5], np.float32), name="grow")
    crop = kit.add(g, "Resize", [xp, roi, grow], {"mode": "cubic", "coordinate_transformation_mode":
                                                  "tf_crop_and_resize", "extrapolation_value": 2.0}, encoding=ACT)
    g.add_output(kit.add(g, "Unpack", [kit.add(g, "Relu", [crop], encoding=ACT)]), "resized")
    halves = g.add_constant(np.array([1.5, 0.5], np.float32), name="halves")
    g.add_output(kit.add(g, "Resize", [h, None, halves], {"mode": "nearest"}), "h_nearest")
    parts = kit.add(g, "Split", [x, g.add_constant(np.array([5, 0, 13], np.int64), name="sizes")], {"axis": 1})
    g.add_output(parts, "part0")
    g.add_output(Value(parts.node, 2), "part2")
    bits = kit.add(g, "Split", [keep], {"axis": -1, "num_outputs": 3})
    g.add_output(Value(bits.node, 1), "bits1")
    spatial = g.add_constant(np.array([0, 0, 2, -1, 0, 0, 1, 3], np.int64), name="spatial")
    nan = g.add_constant(np.array(np.nan, np.float32), name="nan")
    padded = kit.add(g, "Pad", [xp, spatial, nan], {"mode": "constant"}, encoding=ACT.with_pad(None))
    g.add_output(kit.add(g, "Unpack", [kit.add(g, "Relu", [padded], encoding=ACT.with_pad(None))]), "padded")
    g.add_output(kit.add(g, "Pad", [x, spatial], {"mode": "reflect"}), "reflected")
    g.add_output(kit.add(g, "Pad", [h, g.add_constant(np.array([3, 70], np.int64), name="h_pads"),
                                    None, g.add_constant(np.array([1], np.int64), name="h_axes")],
                         {"mode": "wrap"}), "h_wrapped")
    g.add_output(kit.add(g, "Pad", [keep, spatial], {"mode": "edge"}), "keep_edge")
    g.add_output(kit.add(g, "OneHot", [ids, g.add_constant(np.array(8, np.int64), name="depth"),
                                       g.add_constant(np.array([0, 1], np.float16), name="off_on")], {"axis": 0}),
                 "one_hot")
    rows = g.add_constant(np.array([[3, -2, 3], [0, 19, -16]], np.int32), name="rows")
    h_updates = g.add_constant(np.random.default_rng(4).standard_normal((2, 3)).astype(np.float16), name="h_up")
    for reduction in ("max", "none"):
        g.add_output(kit.add(g, "ScatterElements", [h, rows, h_updates], {"axis": 0, "reduction": reduction}),
                     f"h_scatter_{reduction}")
    g.add_output(kit.add(g, "ScatterElements", [table, picks, g.add_constant(np.full((2, 2), 1.5, np.float32),
                                                                              name="factors")],
                         {"axis": 1, "reduction": "mul"}), "table_mul")
    g.add_output(kit.add(g, "ScatterND", [x, g.add_constant(np.array([[0, 5], [1, -1], [0, 5]], np.int64),
                                                           name="planes"),
                                          g.add_constant(np.ones((3, 9, 8), np.float32), name="planes_up")],
                         {"reduction": "add"}), "x_scatter_add")
    slots = g.add_constant(np.array([[0], [2], [-3]], np.int64), name="slots")
    g.add_output(kit.add(g, "ScatterND", [ids, slots, ids], {"reduction": "add"}), "ids_scatter_add")
    g.add_output(kit.add(g, "ScatterElements", [int_ids, g.add_constant(np.array([1, -1, 1], np.int64), name="at"),
                                                g.add_constant(np.array([-5, 9, 2], np.int32), name="int_up")],
                         {"reduction": "min"}), "int_scatter_min")
    last, middle = (g.add_constant(np.array([a], np.int64), name=f"axis{a}") for a in (-1, 1))
    g.add_output(kit.add(g, "ReduceMax", [keep, last], {"keepdims": 1}), "any")
    g.add_output(kit.add(g, "ReduceMin", [keep, middle], {"keepdims": 0}), "all")
    for name, value, k, attrs in (("x", x, 4, {"axis": 1}), ("h", h, 5, {"largest": 0}),
                                  ("ids", ids, 2, {"axis": 0, "largest": 0}),
                                  ("int_ids", int_ids, 3, {"axis": 0})):  # TopK: float32, float16, int64, int32
        top = kit.add(g, "TopK", [value, g.add_constant(np.array([k], np.int64), name=f"top_k_{name}")], attrs)
        g.add_output(top, f"top_{name}")
        g.add_output(Value(top.node, 1), f"top_{name}_indices")
    return g


def _bfloat16_scatters(kit) -> Graph:
    """Scatters of bfloat16 data (no NumPy reference: compiled, not run), which swap 16-bit words."""
    import ml_dtypes

    g = Graph("bfloat16_scatters")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = g.add_input("x", TensorType((6, 5), bf16))
    at = g.add_constant(np.array([[1, -1, 1, 0, 2]], np.int64), name="at")
    up = g.add_constant(np.ones((1, 5), bf16), name="up")
    for reduction in ("add", "max", "none"):
        g.add_output(kit.add(g, "ScatterElements", [x, at, up], {"axis": 1, "reduction": reduction}), reduction)
    return g


def _small_integers(kit) -> Graph:
    """Chains of the narrow and unsigned integers (wrapping arithmetic, Max, bitwise not as an
    XOR with every bit set, quotients and remainders, shifts with their fills, casts), gathers
    of their tables, and their reductions, TopK and CumSum rows."""
    g = Graph("small_integers")
    ids = g.add_input("ids", TensorType((4,), np.int64))
    for dtype in (np.int8, np.uint8, np.int16, np.uint16, np.uint32, np.uint64):
        name = np.dtype(dtype).name
        a = g.add_input(name, TensorType((3, 5), dtype))
        mixed = kit.add(g, "Max", [kit.add(g, "Mul", [a, a]), kit.add(g, "BitwiseNot", [a])])
        remainder = kit.add(g, "Mod", [kit.add(g, "Div", [mixed, a]), a])
        shifted = kit.add(g, "BitShift", [remainder, a], {"direction": "RIGHT"})
        g.add_output(kit.add(g, "Cast", [shifted], {"to": 1}), f"{name}_chain")
        table = g.add_constant(np.arange(12, dtype=dtype).reshape(6, 2), name=f"{name}_table")
        g.add_output(kit.add(g, "Gather", [table, ids], {"axis": 0}), f"{name}_rows")
        g.add_output(kit.add(g, "CumSum", [a, g.add_constant(np.array(1, np.int64), name=f"{name}_axis")]),
                     f"{name}_cumsum")
        for op in ("ReduceSum", "ReduceProd", "ReduceMax"):
            g.add_output(kit.add(g, op, [a, g.add_constant(np.array([1], np.int64), name=f"{name}_{op}_axes")]),
                         f"{name}_{op}")
        if dtype != np.uint64:
            top = kit.add(g, "TopK", [a, g.add_constant(np.array([2], np.int64), name=f"{name}_k")])
            g.add_output(top, f"{name}_top")
    return g


def _long_topk(kit) -> Graph:
    """TopK of a vocabulary-sized row, read in pieces (compiled, not run: the interpreter's
    sorts are slow)."""
    g = Graph("long_topk")
    logits = g.add_input("logits", TensorType((2, 50257), np.float32))
    g.add_output(kit.add(g, "TopK", [logits, g.add_constant(np.array([40], np.int64), name="k")]), "top")
    return g


def _half_attention(kit) -> Graph:
    """Flash attention in float16 (a causal Where, torch's sdpa guard) and in bfloat16 (the ONNX
    exporter's NaN guard, a residual epilogue), K^T in transposed tiles."""
    g = Graph("half_attention")
    for dtype, guard in ((np.float16, "masked"), ("bfloat16", "nan")):
        import ml_dtypes

        dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
        name = np.dtype(dt).name
        q = g.add_input(f"q_{name}", TensorType((2, 4, 40, 64), dt))
        k = np.random.default_rng(5).standard_normal((2, 4, 64, 40)).astype(dt)
        kt = kit.packed_const(g, k, PackedEncoding((3, 2), (16, 16), (0, 1, 3, 2)), f"kt_{name}")
        v = g.add_input(f"v_{name}", TensorType((2, 4, 40, 64), dt))
        s = kit.add(g, "MatMul", [q, kt])
        minus_inf = g.add_constant(np.array(-np.inf, dt), name=f"minus_inf_{name}")
        if guard == "masked":
            s = kit.add(g, "Where", [g.add_constant(np.tril(np.ones((40, 40), bool)), name="causal"), s, minus_inf])
        p = kit.add(g, "Softmax", [s], {"axis": -1})
        zero = g.add_constant(np.array(0, dt), name=f"zero_{name}")
        if guard == "masked":
            seen = kit.add(g, "ReduceMax", [kit.add(g, "Not", [kit.add(g, "Equal", [s, minus_inf])]),
                                            g.add_constant(np.array([-1]), name="last")], {"keepdims": 1})
            p = kit.add(g, "Where", [kit.add(g, "Not", [seen]), zero, p])
        else:
            p = kit.add(g, "Where", [kit.add(g, "IsNaN", [p]), zero, p])
        y = kit.add(g, "MatMul", [p, v])
        g.add_output(kit.add(g, "Add", [y, q]) if guard == "nan" else y, f"y_{name}")
    return g


def _upcast_attention(kit) -> Graph:
    """A bfloat16 sdpa traced on the CPU: Q, K and V cast to float32, K transposed, Q and K
    scaled, all computed by the attention kernel on the tiles it loads."""
    import ml_dtypes

    g = Graph("upcast_attention")
    operands = []
    for name in ("q", "k", "v"):
        x = kit.add(g, "Cast", [g.add_input(name, TensorType((1, 4, 48, 32), ml_dtypes.bfloat16))], {"to": 1})
        if name == "k":
            x = kit.add(g, "Transpose", [x], {"perm": [0, 1, 3, 2]})
        if name != "v":
            x = kit.add(g, "Mul", [x, g.add_constant(np.array(0.42, np.float32), name=f"{name}_scale")])
        operands.append(x)
    p = kit.add(g, "Softmax", [kit.add(g, "MatMul", operands[:2])], {"axis": -1})
    g.add_output(kit.add(g, "Cast", [kit.add(g, "MatMul", [p, operands[2]])], {"to": 16}), "y")
    return g


def _normed_products(kit) -> Graph:
    """Layer norms computed by the matmuls that read them (pre-norm layers; a post-norm one,
    which the kernel also writes for a residual), SiLU(gate) * up of one product's two column
    halves, and the GELU of one column part of another (a parallel block), float32 and
    float16."""
    g = Graph("normed_products")
    rng = np.random.default_rng(6)
    for dtype in (np.float32, np.float16):
        name = np.dtype(dtype).name
        x = g.add_input(f"x_{name}", TensorType((3, 20, 72), dtype))
        normed = kit.add(g, "LayerNormalization", [x, g.add_constant(rng.uniform(0.5, 1.5, 72).astype(dtype),
                                                                     name=f"gamma_{name}"),
                                                   g.add_constant(rng.standard_normal(72).astype(dtype),
                                                                  name=f"beta_{name}")], {"axis": -1})
        w = g.add_constant(rng.standard_normal((72, 48)).astype(dtype), name=f"w_{name}")
        g.add_output(kit.add(g, "Relu", [kit.add(g, "MatMul", [normed, w])]), f"y_{name}")
        both = kit.add(g, "MatMul", [x, g.add_constant(rng.standard_normal((72, 64)).astype(dtype), name=f"wgu_{name}")])
        halves = g.add_node("Split", [both, g.add_constant(np.array([32, 32], np.int64), name=f"halves_{name}")],
                            [TensorType((3, 20, 32), dtype)] * 2, {"axis": -1})
        gate, up = Value(halves.name, 0), Value(halves.name, 1)
        silu = kit.add(g, "Mul", [gate, kit.add(g, "Sigmoid", [gate])])
        g.add_output(kit.add(g, "Mul", [silu, up]), f"swiglu_{name}")
        post = kit.add(g, "LayerNormalization", [x, g.add_constant(rng.uniform(0.5, 1.5, 72).astype(dtype),
                                                                   name=f"gamma_post_{name}")], {"axis": -1})
        h = kit.add(g, "MatMul", [post, g.add_constant(rng.standard_normal((72, 48)).astype(dtype), name=f"w1_{name}")])
        h = kit.add(g, "MatMul", [h, g.add_constant(rng.standard_normal((48, 72)).astype(dtype), name=f"w2_{name}")])
        g.add_output(kit.add(g, "Add", [h, post]), f"post_{name}")
        merged = kit.add(g, "MatMul", [x, g.add_constant(rng.standard_normal((72, 80)).astype(dtype), name=f"wm_{name}")])
        parts = g.add_node("Split", [merged, g.add_constant(np.array([16, 64], np.int64), name=f"parts_{name}")],
                           [TensorType((3, 20, 16), dtype), TensorType((3, 20, 64), dtype)], {"axis": -1})
        g.add_output(Value(parts.name, 0), f"attention_{name}")
        g.add_output(kit.add(g, "Gelu", [Value(parts.name, 1)]), f"mlp_{name}")
    return g


@pytest.mark.parametrize("capability", [90, 80])
def test_generated_kernels_compile_for_the_gpu(kit, capability):
    pytest.importorskip("triton.backends.nvidia")
    graphs = [_variants(kit), _bfloat16_scatters(kit), _small_integers(kit), _long_topk(kit), _half_attention(kit),
              _upcast_attention(kit), _normed_products(kit)]
    for model in (mlp_model(batch=5, sizes=(20, 33, 7)), mlp_model(batch=3, sizes=(18, 40, 6), gemm=True),
                  kit.small_cnn(), kit.tiny_transformer(), qdq_cnn_model(channels=24)):
        plain = tilefold.load(model)
        graphs += [plain, tilefold.optimize(plain, "gpu").graph]
    assert sum(compile_for_cuda(g, capability) for g in graphs) >= 50


def test_the_variants_graph_computes_what_the_numpy_backend_does(kit):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 18, 9, 8)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan
    feeds = {"x": x, "h": rng.standard_normal((20, 64)).astype(np.float16), "ids": np.array([0, -3, 10])}
    got, want = kit.run_both(_variants(kit), feeds, "interp")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-3, atol=2e-3, err_msg=name)


def test_the_half_attention_graph_is_two_attention_kernels_that_compute_attention(kit):
    """Against float64 on the same rounded operands (the NumPy backend has no bfloat16 matmul)."""
    import ml_dtypes

    from tilefold.backends.triton import TritonExecutable
    from tilefold.backends.triton.executor import kernel_plans

    g = _half_attention(kit)
    assert [plan.kind for plan in kernel_plans(g)] == ["attention", "attention"]
    rng = np.random.default_rng(4)
    feeds = {name: rng.standard_normal(t.shape).astype(t.dtype) for name, t in g.input_types().items()}
    got = TritonExecutable(g, device="interp")(feeds)
    for dt, causal in ((np.float16, True), (ml_dtypes.bfloat16, False)):
        name = np.dtype(dt).name
        q, v = (feeds[f"{x}_{name}"].astype(np.float64) for x in "qv")
        kt = np.random.default_rng(5).standard_normal((2, 4, 64, 40)).astype(dt).astype(np.float64)
        s = q @ kt
        if causal:
            s = np.where(np.tril(np.ones((40, 40), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v + (0 if causal else q)
        np.testing.assert_allclose(got[f"y_{name}"].astype(np.float64), want, rtol=3e-2, atol=3e-2, err_msg=name)
