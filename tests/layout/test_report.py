"""The layout report counts standalone runtime layout ops and their bytes, fused layout changes,
packs folded into constants and weight bytes, on hand-built graphs with known answers; and
its Transpose rule agrees with the buffers that the reference `pack` builds."""
import json

import numpy as np
from hypothesis import example, given, settings, strategies as st
from rich.console import Console

from tilefold.graph import Graph, Splat, TensorType, Value
from tilefold.graph.passes.pipeline import PassRecord, PipelineLog
from tilefold.layout import LayoutResult
from tilefold.layout.encoding import PackedEncoding, pack
from tilefold.layout.report import GraphLayout, LayoutReport, moves_data

F32 = np.dtype(np.float32)
NHWC = PackedEncoding((), (), (0, 2, 3, 1))
RSCF = PackedEncoding((), (), (2, 3, 1, 0))
TILED_W = PackedEncoding((0, 1), (16, 16))  # (4, 3, 3, 3) -> (1, 1, 3, 3, 16, 16): padded
RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)


def _t(shape, enc=None, dtype=F32):
    return TensorType(tuple(shape), dtype, enc)


def _op(g: Graph, op: str, inputs, out: TensorType, name: str, **attrs) -> Value:
    return Value(g.add_node(op, inputs, [out], attrs, name=name).name)


def wrapped_graph(batch=1) -> Graph:
    """x -> Pack(NHWC) -> Conv(Pack(w)) -> Unpack -> + splat -> Transpose(size-1 dims only)
    -> Transpose(moves data) -> out; plus Relu on the packed result, transposed as a relabeling."""
    g = Graph("hand")
    x = g.add_input("x", _t((batch, 3, 8, 8)))
    w = g.add_constant(W, name="w")
    px = _op(g, "Pack", [x], _t((batch, 3, 8, 8), NHWC), "pack_x", encoding=NHWC)
    pw = _op(g, "Pack", [w], _t(W.shape, TILED_W), "pack_w", encoding=TILED_W)
    y = _op(g, "Conv", [px, pw], _t((batch, 4, 6, 6), NHWC), "conv")
    u = _op(g, "Unpack", [y], _t((batch, 4, 6, 6)), "unpack_conv")
    half = g.add_constant(Splat(0.5, (1, 4, 6, 6)), name="half")
    a = _op(g, "Add", [u, half], _t((batch, 4, 6, 6)), "add")
    free = _op(g, "Transpose", [a], _t((4, batch, 6, 6)), "swap_unit", perm=(1, 0, 2, 3))
    moving = _op(g, "Transpose", [free], _t((6, batch, 4, 6)), "swap_fh", perm=(2, 1, 0, 3))
    r = _op(g, "Relu", [y], _t((batch, 4, 6, 6), NHWC), "relu")
    perm = (0, 2, 3, 1)
    relabel = _op(g, "Transpose", [r], _t((batch, 6, 6, 4), NHWC.permuted(perm)), "relabel", perm=perm)
    g.add_output(moving, "out")
    g.add_output(relabel, "side")
    return g


def propagated(before: Graph) -> Graph:
    """`before` with the weight's Pack folded into a packed constant and the input's Pack
    absorbed into the conv (which then reads NCHW and writes NHWC)."""
    g = before.copy()
    packed = g.add_constant(pack(W, TILED_W), name="w_packed", type=_t(W.shape, TILED_W))
    g.set_input("conv", 0, Value("x"))
    g.set_input("conv", 1, packed)
    for name in ("pack_x", "pack_w", "w"):
        g.remove_node(name)
    return g


def result() -> LayoutResult:
    before = wrapped_graph()
    log = PipelineLog([PassRecord("materialize", 0.25, True, 10), PassRecord("propagate", 0.5, True, 8),
                       PassRecord("propagate", 0.125, False, 8)])
    return LayoutResult(before, propagated(before), "cpu", log)


def test_counts_only_runtime_layout_ops_that_move_data():
    layout = GraphLayout.of(wrapped_graph())
    # Pack of x (written NHWC: 1*3*8*8 floats), the conv's Unpack (1*4*6*6), the data-moving
    # Transpose (6*1*4*6); not the Pack of the constant, nor the two free Transposes.
    assert [(o.node, o.bytes) for o in layout.ops] == [
        ("pack_x", 768), ("unpack_conv", 576), ("swap_fh", 576)]
    assert layout.count("Pack") == 1 and layout.count("Unpack") == 1 and layout.count("Transpose") == 1
    assert layout.bytes() == 768 + 576 + 576 and layout.exact
    assert layout.constant_layout_ops == 1
    assert layout.fused == []


def test_weight_bytes_count_padding_and_one_element_per_splat():
    before, after = GraphLayout.of(wrapped_graph()), GraphLayout.of(propagated(wrapped_graph()))
    assert before.weight_bytes == W.nbytes + 4  # w, and the splat's one stored float
    assert before.weight_logical_bytes == W.nbytes + 4 * 4 * 6 * 6
    # The folded weight is tiled 16x16 on (F, C) = (4, 3): padded to (16, 16, 3, 3).
    assert after.weight_bytes == 16 * 16 * 3 * 3 * 4 + 4
    assert after.weight_logical_bytes == before.weight_logical_bytes
    assert (before.packed_constants, after.packed_constants) == (0, 1)
    assert (before.splats, after.splats) == (1, 1)


def test_report_compares_before_and_after():
    report = LayoutReport.from_result(result())
    data = report.to_dict()
    assert (data["layout_ops_before"], data["layout_ops_after"]) == (3, 2)
    assert (data["layout_bytes_before"], data["layout_bytes_after"]) == (1920, 1152)
    assert (data["pack_ops_before"], data["pack_ops_after"]) == (1, 0)
    assert data["folded_packs"] == 1
    # The conv reading NCHW x and writing NHWC is a fused change: x's bytes, not a standalone op.
    assert (data["fused_layout_changes_before"], data["fused_layout_changes_after"]) == (0, 1)
    assert data["fused_layout_bytes_after"] == 768
    assert [o["node"] for o in data["layout_ops_left"]] == ["unpack_conv", "swap_fh"]
    assert data["pass_seconds"] == {"materialize": 0.25, "propagate": 0.625}
    assert data["optimize_seconds"] == 0.875
    for key in ("layout_ops_before", "layout_ops_after", "layout_bytes_before", "layout_bytes_after"):
        assert type(data[key]) is int
    assert json.loads(json.dumps(data)) == data


def test_symbolic_dims_count_the_op_and_make_bytes_a_lower_bound():
    layout = GraphLayout.of(wrapped_graph(batch="N"))
    # The batch may not be 1 now, so moving it is a data movement too: 4 ops, bytes unknown.
    assert [o.node for o in layout.ops] == ["pack_x", "unpack_conv", "swap_unit", "swap_fh"]
    assert layout.bytes() == 0 and not layout.exact
    text = _render(LayoutReport("m", "cpu", layout, layout, 0))
    assert ">= 0 B" in text


def test_renders_as_a_table_and_as_html():
    report = LayoutReport.from_result(result(), load_seconds=0.5)
    text = _render(report)
    for expected in ("runtime layout ops", "packs folded into weights", "propagate",
                     "625.0 ms", "load", "swap_fh", "1.9 kB"):
        assert expected in text
    page = report._repr_html_()
    assert page.count("<table>") == 3 and "unpack_conv" in page and "target cpu" in page


def _render(report: LayoutReport) -> str:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))
    console.print(report)
    return console.export_text()


# ---- the Transpose rule against real buffers ------------------------------------------
@st.composite
def transpose_case(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.sampled_from([1, 1, 2, 3, 4, 6]), min_size=rank, max_size=rank)))
    perm = tuple(draw(st.permutations(range(rank))))

    def encoding():
        if draw(st.booleans()):
            return None
        tiled = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=2))
        tiles = tuple(draw(st.sampled_from([1, 2, 3, 4, 6])) for _ in tiled)
        return PackedEncoding(tuple(tiled), tiles, tuple(draw(st.permutations(range(rank)))))

    source = encoding()
    relabeled = (source or PackedEncoding((), ())).permuted(perm)
    result = draw(st.sampled_from([relabeled, None, encoding()]))
    return shape, perm, source, result


def _buffer(x: np.ndarray, enc) -> np.ndarray:
    return x if enc is None else pack(x, enc)


@given(transpose_case())
@example(((6,), (0,), PackedEncoding((0,), (2,)), None))  # a tile splitting the last dim: same order
@example(((2, 6), (1, 0), None, PackedEncoding((1,), (6,))))  # a tile spanning its dim
@example(((2, 5), (0, 1), None, PackedEncoding((1,), (2,))))  # padding
@example(((1, 1, 2), (0, 2, 1), PackedEncoding((0, 2), (2, 2)), PackedEncoding((1,), (4,))))  # the same bytes, reported
@settings(max_examples=400, deadline=None)
def test_a_transpose_moves_data_exactly_when_the_buffers_differ(case):
    shape, perm, source, result = case
    x = np.arange(1, 1 + int(np.prod(shape)), dtype=np.float32).reshape(shape)  # distinct, never the pad
    g = Graph()
    xin = g.add_input("x", _t(shape, source))
    node = g.add_node("Transpose", [xin], [_t(x.transpose(perm).shape, result)], {"perm": perm})
    a, b = _buffer(x, source).ravel(), _buffer(x.transpose(perm), result).ravel()
    same = a.shape == b.shape and np.array_equal(a, b)
    moves = moves_data(node, g.type_of(xin))
    if not same:
        assert moves  # a relabeling never hides a copy
    elif moves:  # the one conservative case: a size-1 dim's tile pads bytes that another dim's padding matches
        out_shape = x.transpose(perm).shape
        assert any(n == 1 and t > 1 for enc, dims in ((source, shape), (result, out_shape)) if enc is not None
                   for n, t in ((dims[d], t) for d, t in enc.tiles().items())), case


def test_transpose_without_perm_reverses_the_dims():
    g = Graph()
    x = g.add_input("x", _t((1, 5)))
    node = g.add_node("Transpose", [x], [_t((5, 1))], {})
    assert not moves_data(node, g.type_of(x))
    y = g.add_input("y", _t((2, 5)))
    node = g.add_node("Transpose", [y], [_t((5, 2))], {})
    assert moves_data(node, g.type_of(y))
