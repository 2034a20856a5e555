"""The model-zoo architectures that ship with onnx (`onnx/backend/test/data/light`).

Their weights are `ConstantOfShape` splats (every weight 0.02), so their shipped reference
outputs are a uniform softmax that a wrong kernel can still reproduce. `light_model(...,
random_weights=True)` swaps each splat for a random initializer, scaled by the role of the
tensor it feeds, so that numerics can be compared for real.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)

# (consumer op, input slot) -> role of a weight tensor; the role picks its distribution.
_ROLES: dict[tuple[str, int], str] = {
    ("Conv", 1): "weight",
    ("Gemm", 1): "weight",
    ("MatMul", 1): "weight",
    ("Conv", 2): "bias",
    ("Gemm", 2): "bias",
    ("BatchNormalization", 1): "gain",
    ("BatchNormalization", 2): "bias",
    ("BatchNormalization", 3): "mean",
    ("BatchNormalization", 4): "var",
    ("Mul", 1): "gain",
    ("Add", 1): "bias",
}
# Ops that hand a weight on unchanged in value (only its shape changes).
_PASS_THROUGH = {"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity"}


def light_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_path(name: str) -> Path:
    """The shipped `light_<name>.onnx` file."""
    if name not in LIGHT_MODELS:
        raise ValueError(f"unknown light model {name!r}; choose one of {', '.join(LIGHT_MODELS)}")
    return light_dir() / f"light_{name}.onnx"


def data_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are real inputs (IR 3 models also list every initializer)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def static_shape(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    """An input's shape with symbolic dims set to 1, as the ONNX backend runner does."""
    dims = info.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)


def light_reference(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The input the ONNX backend runner feeds a light model, and its shipped outputs."""
    from onnx.backend.test.runner import Runner

    path = light_path(name)
    model = onnx.load(path)
    inputs = {i.name: Runner.generate_dummy_data(i, name=name) for i in data_inputs(model)}
    outputs = {}
    for k, out in enumerate(model.graph.output):
        tensor = onnx.load_tensor(str(path.with_name(f"{path.stem}_output_{k}.pb")))
        outputs[out.name] = numpy_helper.to_array(tensor)
    return inputs, outputs


def light_model(name: str, *, random_weights: bool, seed: int = 0) -> onnx.ModelProto:
    """A light model as shipped, or with each splat weight replaced by a random initializer."""
    model = onnx.load(light_path(name))
    if random_weights:
        rng = np.random.default_rng(seed)
        randomize_splat_weights(model, rng)
        calibrate_logits(model, rng)
    return model


def randomize_splat_weights(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    """Replace every `ConstantOfShape(initializer)` node by a random initializer, in place.

    Scales keep activations of order one through 50+ layers: He-uniform weights
    (std sqrt(2 / fan_in)), biases and BatchNorm means ~N(0, 0.1), gains ~U(0.8, 1.2)
    and variances ~U(0.5, 1.5), so that a BatchNorm multiplies by ~1 on average. The gain
    of a BatchNorm that ends a residual branch is ~U(0.2, 0.3) (as in "zero-gamma" residual
    init), else each residual sum would double the variance: 1e4 x growth over ResNet-50.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))

    splats = [
        n for n in graph.node
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in inits
    ]
    joins = _residual_join_inputs(graph)
    arrays: dict[str, np.ndarray] = {}
    for node in splats:
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dtype = numpy_helper.to_array(value).dtype if value is not None else np.dtype(np.float32)
        role, fan_in = _role(node.output[0], shape, consumers, joins)
        arrays[node.output[0]] = _sample(rng, role, shape, fan_in).astype(dtype, copy=False)

    # Edits in place: rebuilding the repeated fields would copy every weight (seconds for VGG).
    _delete(graph.node, lambda n: n.op_type == "ConstantOfShape" and n.output[0] in arrays)
    used = {name for node in graph.node for name in node.input}
    dead = {n.input[0] for n in splats} - used
    _delete(graph.initializer, lambda t: t.name in dead)
    _delete(graph.input, lambda i: i.name in dead)
    for name, array in arrays.items():
        tensor = graph.initializer.add()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.tobytes()
        if model.ir_version < 4:  # IR 3: every initializer must also be a graph input
            graph.input.append(helper.make_tensor_value_info(name, tensor.data_type, array.shape))


def _delete(field: Any, doomed: Callable[[Any], bool]) -> None:
    """Delete the matching entries of a protobuf repeated field, in place."""
    for k in reversed([k for k, item in enumerate(field) if doomed(item)]):
        del field[k]


def calibrate_logits(model: onnx.ModelProto, rng: np.random.Generator, target_rms: float = 3.0) -> float:
    """Scale the last Conv/Gemm/MatMul's weight and bias so its output has rms `target_rms`.

    Random weights leave the logits' scale to chance (the few trained initializers that the
    light models keep, residual sums); logits of rms ~3 give a softmax that is neither
    uniform nor one-hot, so a comparison of outputs means something. One onnxruntime run on a
    standard-normal input measures the scale; returns the factor applied.
    """
    import onnxruntime as ort

    graph = model.graph
    last = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")][-1]
    graph.output.append(onnx.ValueInfoProto(name=last.output[0]))  # probe it, then drop it
    try:
        data = model.SerializeToString()
    finally:
        del graph.output[-1]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    del data
    feeds = {i.name: rng.standard_normal(static_shape(i)).astype(np.float32) for i in data_inputs(model)}
    logits = session.run([last.output[0]], feeds)[0]
    factor = target_rms / float(np.sqrt(np.mean(np.square(logits, dtype=np.float64))))

    producers = {out: node for node in graph.node for out in node.output}
    inits = {t.name: k for k, t in enumerate(graph.initializer)}
    for name in last.input[1:3]:
        while name in producers and producers[name].op_type in _PASS_THROUGH:
            name = producers[name].input[0]
        if name in inits:
            tensor = graph.initializer[inits[name]]
            scaled = numpy_helper.to_array(tensor) * np.float32(factor)
            tensor.ClearField("float_data")
            tensor.raw_data = scaled.astype(np.float32).tobytes()
    return factor


def _residual_join_inputs(graph: onnx.GraphProto) -> set[str]:
    """Tensors summed with another computed tensor (a residual connection's branches)."""
    constant = {t.name for t in graph.initializer}
    joins: set[str] = set()
    for node in graph.node:  # nodes are topologically sorted
        computed = [x for x in node.input if x and x not in constant]
        if not computed:
            constant.update(node.output)
        elif node.op_type in ("Sum", "Add") and len(computed) >= 2:
            joins.update(computed)
    return joins


def _role(
    name: str,
    shape: tuple[int, ...],
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]],
    joins: set[str],
) -> tuple[str, int]:
    """The role of a weight (looking through reshapes) and its fan-in."""
    seen = 0
    while name in consumers and seen < 8:
        node, slot = consumers[name][0]
        if node.op_type in _PASS_THROUGH and slot == 0:
            name, seen = node.output[0], seen + 1
            continue
        role = _ROLES.get((node.op_type, slot), "other")
        if role == "gain" and node.output[0] in joins:
            return "residual_gain", 1
        if role != "weight":
            return role, 1
        if node.op_type == "Conv":
            return role, int(np.prod(shape[1:]))
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        k_axis = -1 if node.op_type == "Gemm" and trans_b else -2
        return role, shape[k_axis] if len(shape) >= 2 else shape[0]
    return "other", 1


def _sample(rng: np.random.Generator, role: str, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """float32 draws (a float64 draw would double the time and memory of VGG's 140M weights)."""
    f32 = np.float32
    if role == "weight":  # He-uniform: uniform draws are twice as fast as normal ones
        bound = f32(np.sqrt(6.0 / max(fan_in, 1)))
        return rng.random(shape, dtype=f32) * (2 * bound) - bound
    low, high = {"gain": (0.8, 1.2), "residual_gain": (0.2, 0.3), "var": (0.5, 1.5)}.get(role, (None, None))
    if low is not None:
        return rng.random(shape, dtype=f32) * f32(high - low) + f32(low)
    return rng.standard_normal(shape, dtype=f32) * f32(0.1)
