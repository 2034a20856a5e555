"""Graph drawings (graph/draw.py) and summaries (graph/summary.py), for notebooks.

Drawings: a PNG is written and shows something; a 1,000-node graph is collapsed into a
bounded number of boxes; `around`/`nodes` pick the part drawn; Pack, Unpack, packed values
and devices are marked. Summaries: every count checked against the graph it describes.
"""
import re
from collections import deque

import matplotlib.image
import networkx as nx
import numpy as np
import pytest
from matplotlib.figure import Figure
from rich.console import Console

import tilefold
from tilefold.bench.models import mlp
from tilefold.graph import CONSTANT, Graph, Splat, TensorType, TilefoldError, Value
from tilefold.graph.draw import draw, draw_comparison, layout_counts, plan, short_encoding
from tilefold.graph.summary import summary
from tilefold.graph.verify import verify_graph
from tilefold.layout.encoding import PackedEncoding

F32 = np.dtype("float32")
ENC = PackedEncoding((1,), (8,))


def synthetic(blocks: int, seed: int = 0) -> Graph:
    """`blocks` residual-ish blocks of 8 nodes each: two branches joined by Add, a packed
    Relu between a Pack and an Unpack, and a Mul by a fresh random constant."""
    rng = np.random.default_rng(seed)
    g = Graph("synthetic")
    t = TensorType((8, 16), F32)
    packed = TensorType((8, 16), F32, ENC)
    x = g.add_input("x", t)
    for _ in range(blocks):
        a = Value(g.add_node("Relu", [x], [t]).name)
        b = Value(g.add_node("Sigmoid", [x], [t]).name)
        c = Value(g.add_node("Add", [a, b], [t]).name)
        p = Value(g.add_node("Pack", [c], [packed], {"encoding": ENC}).name)
        q = Value(g.add_node("Relu", [p], [packed]).name)
        u = Value(g.add_node("Unpack", [q], [t]).name)
        w = g.add_constant(rng.standard_normal((8, 16)).astype(np.float32))
        x = Value(g.add_node("Mul", [u, w], [t]).name)
    g.add_output(x, "y")
    return g


def chain(length: int, pack_at: int) -> Graph:
    """x -> Relu * length -> y, with a Pack, packed Relu, Unpack after Relu number `pack_at`."""
    g = Graph("chain")
    t = TensorType((4, 16), F32)
    x = g.add_input("x", t)
    for i in range(length):
        x = Value(g.add_node("Relu", [x], [t]).name)
        if i == pack_at:
            p = Value(g.add_node("Pack", [x], [TensorType((4, 16), F32, ENC)], {"encoding": ENC}).name)
            q = Value(g.add_node("Relu", [p], [TensorType((4, 16), F32, ENC)], name="packed_relu").name)
            x = Value(g.add_node("Unpack", [q], [t]).name)
    g.add_output(x, "y")
    return g


@pytest.fixture(scope="module")
def mlp_gpu(tmp_path_factory) -> tilefold.Optimized:
    path = mlp(tmp_path_factory.mktemp("draw") / "mlp.onnx", sizes=(32, 48, 64, 16), batch=16)
    return tilefold.optimize(tilefold.load(path), "gpu")


def node_texts(fig: Figure) -> list:
    return [t for ax in fig.axes for t in ax.texts if (t.get_gid() or "").count(":")]


def kind_of(text) -> str:
    return text.get_gid().split(":", 1)[0]


# ---- drawings -------------------------------------------------------------------------------
def test_png_is_written_atomically_and_shows_the_graph(tmp_path, mlp_gpu):
    path = tmp_path / "graph.png"
    fig = mlp_gpu.graph.draw(path=path)
    assert isinstance(fig, Figure)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.png"]  # no temporary file left
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    colours = np.unique(image.reshape(-1, image.shape[-1]), axis=0)
    assert len(colours) > 10  # boxes, fills and text, not a blank page


def test_draw_writes_over_an_existing_file(tmp_path, mlp_gpu):
    path = tmp_path / "graph.png"
    path.write_bytes(b"old")
    mlp_gpu.before.draw(path=path)
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_thousand_node_graph_is_collapsed_into_a_bounded_drawing(tmp_path):
    g = synthetic(125)
    verify_graph(g)
    assert len(g) >= 1000
    drawing = plan(g, max_nodes=80)
    assert drawing.collapsed and "collapsed" in drawing.title
    assert len(drawing.boxes) <= 80
    members = [m for box in drawing.boxes.values() for m in box.members]
    computed = [n.name for n in g.nodes() if n.op != CONSTANT]
    assert sorted(members) == sorted(computed)  # every computed node in exactly one box
    assert drawing.hidden_constants == 125
    dag = nx.DiGraph([(e.src, e.dst) for e in drawing.edges])
    assert nx.is_directed_acyclic_graph(dag)
    fig = draw(g, max_nodes=80, path=tmp_path / "big.png")
    assert 0 < len(node_texts(fig)) <= 80
    assert (tmp_path / "big.png").stat().st_size > 0


def test_chains_merge_into_counted_boxes_and_layout_ops_keep_their_own(tmp_path):
    g = chain(300, pack_at=120)
    drawing = plan(g, max_nodes=50)
    labels = sorted(box.label.split("\n")[0] for box in drawing.boxes.values() if box.kind == "group")
    assert labels == ["121 nodes", "179 nodes"]  # Relus before the Pack, Relus after the Unpack
    kinds = drawing.kinds()
    assert (kinds["Pack"], kinds["Unpack"], kinds["Input"], kinds["Output"]) == (1, 1, 1, 1)
    assert len(drawing.boxes) == 7  # input, 2 runs, Pack, packed Relu, Unpack, output
    assert not plan(g, max_nodes=50, collapse=False).collapsed
    assert len(plan(chain(10, pack_at=3), collapse=True).boxes) == 7


def _within(graph: Graph, start: str, depth: int) -> set[str]:
    """Computed nodes at most `depth` edges from `start`, either direction, not via constants."""
    seen = {start: 0}
    queue = deque([start])
    while queue:
        name = queue.popleft()
        if seen[name] == depth:
            continue
        node = graph.node(name)
        neighbours = [v.node for v in graph.inputs_of(name) if v is not None]
        neighbours += [user for slot in range(len(node.outputs)) for user, _ in graph.users(Value(name, slot))]
        for other in neighbours:
            if other not in seen and graph.node(other).op != CONSTANT:
                seen[other] = seen[name] + 1
                queue.append(other)
    return set(seen)


@pytest.mark.parametrize("depth", [1, 3])
def test_around_draws_the_neighbourhood(depth):
    g = synthetic(20)
    drawing = plan(g, around="pack_7", depth=depth)
    drawn = {m for box in drawing.boxes.values() for m in box.members}
    assert drawn == _within(g, "pack_7", depth)
    assert "around pack_7" in drawing.title
    cut = {k for k, box in drawing.boxes.items() if box.cut_in or box.cut_out}
    assert cut == {n for n in drawn if any(m not in drawn and g.node(m).op != CONSTANT
                                           for m in set(g.nx.predecessors(n)) | set(g.nx.successors(n)))}
    assert not any(box.cut_in or box.cut_out for box in plan(g).boxes.values())
    with_constants = plan(g, around="pack_7", depth=depth, constants="fade")
    faded = [b for b in with_constants.boxes.values() if b.kind == CONSTANT]
    assert {m for b in faded for m in b.members} == {
        v.node for n in drawn for v in g.inputs_of(n) if v is not None and g.node(v.node).op == CONSTANT}


def test_nodes_draws_exactly_the_chosen_nodes():
    g = synthetic(5)
    add = g.inputs_of("pack_2")[0].node
    relu, sigmoid = (v.node for v in g.inputs_of(add))
    chosen = [relu, sigmoid, add, "pack_2"]
    drawing = plan(g, nodes=chosen)
    assert sorted(m for b in drawing.boxes.values() for m in b.members) == sorted(chosen)
    assert {(e.src, e.dst) for e in drawing.edges} == {(relu, add), (sigmoid, add), (add, "pack_2")}


def test_bad_selections_fail_with_one_line_errors():
    g = synthetic(2)
    with pytest.raises(TilefoldError, match="no node named 'nope'"):
        plan(g, around="nope")
    with pytest.raises(TilefoldError, match="either around= or nodes="):
        plan(g, around="pack", nodes=["pack"])
    with pytest.raises(TilefoldError, match="constants="):
        plan(g, constants="show")


def test_packs_unpacks_and_packed_values_are_marked(mlp_gpu):
    before = mlp_gpu.before
    fig = draw(before)
    kinds = [kind_of(t) for t in node_texts(fig)]
    ops = before.op_counts()
    assert kinds.count("Pack") == ops["Pack"] and kinds.count("Unpack") == ops["Unpack"]
    pack_labels = [t.get_text() for t in node_texts(fig) if kind_of(t) == "Pack"]
    assert all(label.startswith("Pack\n") and "0:16,1:16" in label for label in pack_labels)
    ax = fig.axes[0]
    packed = [c for c in ax.collections if c.get_gid() == "packed-edges"]
    want = sum(1 for src, dst, d in before.nx.edges(data=True)
               if before.node(src).op != CONSTANT and before.node(src).outputs[d["src"]].encoding is not None)
    assert len(packed) == 1 and len(packed[0].get_segments()) == want > 0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"Pack", "Unpack", "packed value"} <= set(legend)
    pack_fill = [t.get_bbox_patch().get_facecolor() for t in node_texts(fig) if kind_of(t) == "Pack"][0]
    op_fill = [t.get_bbox_patch().get_facecolor() for t in node_texts(fig) if kind_of(t) == "op"][0]
    assert pack_fill != op_fill


def test_devices_are_borders_with_a_legend():
    g = synthetic(3)
    for node in g.nodes():
        node.device = "cuda:0" if node.op in ("Pack", "Relu") else "cpu"
    fig = draw(g)
    legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"device cuda:0", "device cpu"} <= legend
    borders = {kind_of(t): t.get_bbox_patch().get_edgecolor() for t in node_texts(fig)}
    assert borders["Pack"] != borders["Unpack"]


def test_transfers_have_their_own_mark():
    g = Graph("two devices")
    t = TensorType((2, 3), F32)
    x = g.add_input("x", t)
    a = g.add_node("Relu", [x], [t], name="a")
    moved = g.add_node("Transfer", [Value("a")], [t], name="to_cpu")
    b = g.add_node("Relu", [Value("to_cpu")], [t], name="b")
    g.add_output(Value("b"), "y")
    a.device, moved.device, b.device = "cuda:0", "cpu", "cpu"
    fig = draw(g)
    kinds = {t.get_gid(): t.get_bbox_patch().get_facecolor() for t in node_texts(fig)}
    assert "transfer:to_cpu" in kinds and kinds["transfer:to_cpu"] != kinds["op:b"]
    legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"transfer", "device cuda:0", "device cpu"} <= legend
    assert layout_counts(g) == "0 Pack, 0 Unpack, 0 Transpose, 1 Transfer"
    assert [len(b.members) for b in plan(g, collapse=True).boxes.values()] == [1, 1, 1, 1, 1]


def test_comparison_titles_count_the_layout_ops(mlp_gpu):
    fig = mlp_gpu.draw()
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2
    for title, graph, when in zip(titles, (mlp_gpu.before, mlp_gpu.graph), ("before", "after")):
        runtime = {op: sum(1 for n in graph.nodes() if n.op == op and graph.node(graph.inputs_of(n.name)[0].node).op
                           != CONSTANT) for op in ("Pack", "Unpack")}
        assert title == f"{when}: {runtime['Pack']} Pack, {runtime['Unpack']} Unpack, 0 Transpose"
    assert layout_counts(mlp_gpu.before) != layout_counts(mlp_gpu.graph)
    fig = draw_comparison(mlp_gpu.before, mlp_gpu.graph, around="matmul1", depth=1)
    assert all("Pack" in ax.get_title() for ax in fig.axes)


def test_draws_into_given_axes():
    fig = Figure()
    ax = fig.add_subplot()
    assert draw(synthetic(2), ax=ax) is fig
    assert len(node_texts(fig)) == 2 * 7 + 2


def test_empty_selection_draws_a_note():
    fig = draw(synthetic(1), nodes=[])
    assert any("nothing to draw" in t.get_text() for t in fig.axes[0].texts)


def test_short_encoding():
    assert short_encoding(PackedEncoding((1,), (16,))) == "1:16"
    assert short_encoding(PackedEncoding((), (), (0, 2, 3, 1))) == "outer=0231"
    assert short_encoding(PackedEncoding((0,), (8,), pad=None)) == "0:8 pad=?"


# ---- summaries ------------------------------------------------------------------------------
def test_summary_counts_match_the_graph(tmp_path, mlp_gpu):
    sizes = (32, 48, 40, 10)
    plain = summary(tilefold.load(mlp(tmp_path / "mlp.onnx", sizes=sizes, batch=4)))
    assert plain.ops == {"Add": 3, "MatMul": 3, "Relu": 2}
    assert plain.inputs == [("x", "float32[4x32]")] and plain.outputs == [("y", "float32[4x10]")]
    params = sum(k * n + n for k, n in zip(sizes[:-1], sizes[1:]))
    assert plain.parameters == params and plain.weight_bytes == 4 * params
    assert plain.constants == 6 and plain.nodes == 6 + 8 + 2
    assert plain.runtime_layout_ops == {} and plain.packed_values == 0 and plain.devices == {}

    before = summary(mlp_gpu.before)
    report = mlp_gpu.report
    assert before.runtime_layout_ops == {"Pack": report.before.count("Pack"), "Unpack": report.before.count("Unpack")}
    assert before.constant_layout_ops == report.before.constant_layout_ops == 3  # the MatMul weights
    after = summary(mlp_gpu.graph)
    assert sum(after.runtime_layout_ops.values()) == report.after.count()
    assert after.packed_constants == report.after.packed_constants > 0
    assert after.weight_bytes == report.after.weight_bytes > plain.weight_bytes  # tiles are padded


def test_summary_counts_splats_devices_transfers_and_fallbacks():
    g = Graph("mixed")
    t = TensorType((2, 3), F32)
    x = g.add_input("x", t)
    s = g.add_constant(Splat(2.0, (2, 3), F32), name="two")
    m = g.add_node("Mul", [x, s], [t], name="mul")
    m.device = "cuda:0"
    moved = g.add_node("Transfer", [Value("mul")], [t], name="to_cpu")
    moved.device = "cpu"
    ref = g.add_node("OnnxReference", [Value("to_cpu")], [t], {"onnx_op": "Hardmax", "output_types": [t]})
    ref.device = "cpu"
    g.add_output(Value(ref.name), "y")
    s_ = summary(g, has_kernel=lambda op: op != "OnnxReference")
    assert s_.splats == 1 and s_.weight_bytes == 4 and s_.parameters == 6
    assert s_.devices == {"cpu": 2, "cuda:0": 1} and s_.transfers == 1
    assert s_.fallback_ops == {"Hardmax": 1}
    assert s_.no_kernel == ["OnnxReference"]
    assert "devices" in dict(s_.rows()) and "via onnx.reference" in dict(s_.rows())
    assert summary(g).no_kernel is None


def test_summary_text_rich_and_html_forms():
    g = synthetic(4)
    s = g.summary()
    text = str(s)
    assert "Pack 4" in text and "Unpack 4" in text and "Relu 8" in text
    assert re.search(r"runtime Pack/Unpack\s+Pack 4, Unpack 4", text)
    console = Console(record=True, width=200)
    console.print(s)
    assert "Sigmoid 4" in console.export_text()
    html = s._repr_html_()
    assert html.startswith("<table>") and "<td style='text-align:left'>x: float32[8x16]</td>" in html
    g.add_input("a<b", TensorType((1,), F32))
    assert "a&lt;b" in g.summary()._repr_html_()
