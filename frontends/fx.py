"""PyTorch -> Graph: an ATen-level `torch.fx.GraphModule` (core ATen) into a tilefold Graph.

    graph = from_torch(module, (x,))                      # notebooks: the Graph the backend sees
    compiled = torch.compile(module, backend="tilefold")  # the torch.compile backend (fx_backend.py)

1. A placeholder whose tensor is frozen (a parameter or buffer of a module compiled for
   inference) becomes a read-only constant sharing memory with the torch tensor, so that
   layouts fold into it exactly as into ONNX initializers; other placeholders are inputs
   typed from the traced metadata (`meta["val"]`, static shapes).
2. `get_attr` tensors (constants lifted by tracing) become constants too.
3. Each `call_function` node goes through its rule in fx_ops.RULES; `operator.getitem`
   picks one result of a multi-result node.
4. The outputs are the graph's outputs `output_0, ...`; a non-tensor output (None, a
   number) is kept in `graph.meta["fx_outputs"]` so that a runner can rebuild the tuple.

`unsupported_nodes(gm, accepts)` says, per node, why a rule cannot take it (no rule, a dtype or
a device the backend does not run (`Accepts`), symbolic shape, an attribute): the backend
partitions the graph on it. Frozen tensors on a GPU are copied to the host as constants (the
Triton executor moves its constants to its device once); bfloat16 tensors become ml_dtypes
arrays (NumPy has no bfloat16 of its own), which the Triton backend runs and the NumPy
backend does not.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.fx

from ..graph.errors import UnsupportedOpError
from ..graph.graph import Graph
from ..graph.types import Value, freeze
from .fx_emit import Emitter, supported_dtype, tensor_type, torch_to_numpy_dtype
from .fx_ops import RULES, SUPPORTED_OPS
from .fx_ops_nn import RESAMPLING

OUTPUT_PREFIX = "output_"


@dataclass(frozen=True)
class Accepts:
    """The tensors a backend runs: on these torch device types (None: any), and whether of
    bfloat16."""

    devices: frozenset[str] | None = frozenset({"cpu"})
    bfloat16: bool = False


NUMPY_BACKEND = Accepts()
ANYTHING = Accepts(None, True)


def graph_from_fx(gm: torch.fx.GraphModule, frozen: Mapping[str, torch.Tensor] | None = None,
                  name: str = "torch", accepts: Accepts = NUMPY_BACKEND) -> Graph:
    """The Graph of an ATen-level GraphModule with static shapes; placeholders named in
    `frozen` become constants holding those tensors (see module docstring); tensors must be
    ones the backend `accepts`."""
    frozen = frozen or {}
    graph = Graph(name)
    emit = Emitter(graph)
    outputs: list[Any] = []
    # placeholders first: a split graph's boundary inputs may follow computation, whose helper
    # nodes (named for their ops) must not take an input's name
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    rest = [n for n in gm.graph.nodes if n.op != "placeholder"]
    for node in placeholders + rest:
        if node.op == "placeholder":
            if node.name in frozen:
                if not node.users:  # an unused buffer (num_batches_tracked): no constant
                    continue
                emit.values[node] = emit.constant(numpy_view(frozen[node.name]), name=node.name)
            elif isinstance(node.meta.get("val"), torch.Tensor):
                emit.values[node] = graph.add_input(node.name, tensor_type(node.meta["val"]))
            else:
                emit.values[node] = node.meta.get("val")
        elif node.op == "get_attr":
            emit.values[node] = emit.constant(numpy_view(_attr(gm, node.target)), name=node.name)
        elif node.op == "call_function":
            reason = unsupported_reason(node, accepts)
            if reason is not None:
                error = UnsupportedOpError(f"fx node {node.name!r} ({node.target}): {reason}")
                error.fx_node = node.name  # type: ignore[attr-defined]
                raise error
            try:
                if node.target is operator.getitem:
                    emit.values[node] = emit.values[node.args[0]][node.args[1]]
                else:
                    emit.values[node] = RULES[node.target].convert(emit, node)
            except UnsupportedOpError as exc:
                exc.fx_node = node.name  # type: ignore[attr-defined]  (the backend runs it eagerly)
                raise
        elif node.op == "output":
            outputs = list(node.args[0]) if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
        else:
            raise UnsupportedOpError(f"fx node {node.name!r}: {node.op} nodes are not supported")
    plan: list[Any] = []
    for index, out in enumerate(outputs):
        value = emit.values.get(out) if isinstance(out, torch.fx.Node) else None
        if isinstance(value, Value):
            graph.add_output(value, f"{OUTPUT_PREFIX}{index}")
            plan.append(f"{OUTPUT_PREFIX}{index}")
        else:
            plan.append({"value": value if isinstance(out, torch.fx.Node) else out})
    graph.meta["fx_outputs"] = plan
    graph.meta["source"] = f"{name} (torch.fx)"
    return graph


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A read-only numpy array of a tensor, sharing the memory of a contiguous CPU tensor (a
    GPU tensor is copied to the host)."""
    array = tensor.detach()
    if not supported_dtype(array.dtype):
        raise UnsupportedOpError(f"a tensor of element type {array.dtype} is not supported by tilefold")
    if array.device.type != "cpu":
        array = array.cpu()
    if array.dtype == torch.bfloat16:  # torch gives NumPy no bfloat16 arrays: its bits, as ml_dtypes'
        return freeze(np.require(array.contiguous().view(torch.int16).numpy(), requirements="C")
                      .view(torch_to_numpy_dtype(torch.bfloat16)))
    # np.require, not np.ascontiguousarray: that one makes a 0-d tensor (CLIP's logit_scale) 1-d
    return freeze(np.require(array.resolve_conj().resolve_neg().numpy(), requirements="C"))


def _attr(gm: torch.nn.Module, target: str) -> torch.Tensor:
    for part in target.split("."):
        gm = getattr(gm, part)
    if not isinstance(gm, torch.Tensor):
        raise UnsupportedOpError(f"get_attr {target!r} is not a tensor")
    return gm


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return [value] if isinstance(value, torch.Tensor) else []


def unsupported_reason(node: torch.fx.Node, accepts: Accepts = NUMPY_BACKEND) -> str | None:
    """Why tilefold cannot convert this call_function node for a backend that `accepts` some
    tensors, or None when it can."""
    if node.target is operator.getitem:
        return None
    rule = RULES.get(node.target)
    if rule is None:
        return "no tilefold rule for this op"
    vals = _tensors(node.meta.get("val"))
    for a in node.all_input_nodes:
        vals += _tensors(a.meta.get("val"))
    for val in vals:
        if not supported_dtype(val.dtype) or (val.dtype == torch.bfloat16 and not accepts.bfloat16):
            return f"element type {val.dtype}"
        if accepts.devices is not None and val.device.type not in accepts.devices:
            return f"a tensor on {val.device}"
        if any(not isinstance(d, int) for d in val.shape):
            return "a symbolic shape"
    if "val" not in node.meta:
        return "no traced metadata"
    try:
        return rule.check(node) if rule.check is not None else None
    except Exception as exc:  # a check that cannot read this node's arguments
        return f"unexpected arguments ({exc})"


def unsupported_nodes(gm: torch.fx.GraphModule, accepts: Accepts = NUMPY_BACKEND) -> dict[torch.fx.Node, str]:
    """Every call_function node tilefold cannot convert for a backend that `accepts` some
    tensors (see unsupported_reason), with the reason."""
    found = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            reason = unsupported_reason(node, accepts)
            if reason is not None:
                found[node] = reason
    return found


_ASSERTIONS = frozenset({torch.ops.aten._assert_tensor_metadata.default, torch.ops.aten._assert_async.default})

DECOMPOSED = (torch.ops.aten.native_group_norm, torch.ops.aten.linalg_vector_norm,
              torch.ops.aten._native_batch_norm_legit)
"""Core ATen ops tilefold has no rule for but PyTorch's decomposition table rewrites into ops
it has (reductions, elementwise arithmetic, views): decomposed rather than run eagerly (batch
statistics: BiT's weight standardization, `batch_norm(training=True)` of a weight)."""


def _flash_attention_for_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                             is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU flash attention as its math, its output laid out as the kernel writes it.

    PyTorch's own decomposition returns the output in (L, N, H, E) memory order, which the
    kernel of this PyTorch writes as plain (N, H, L, E): a model that traced a view of the
    kernel's layout (transformers' GPT-2 with sdpa attention: transpose, then a no-op copy,
    then a view) then failed `torch.export`'s decomposition with "Cannot view a tensor".
    """
    output, attn = torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=query.size(1) != key.size(1))
    return output.contiguous(), attn


def decompositions() -> dict:
    """The decomposition table of both the backend and `from_torch`: core ATen plus DECOMPOSED,
    less the resampling ops that rules convert whole (`fx_ops_nn.RESAMPLING`), with the CPU
    flash attention's output in the kernel's layout (`_flash_attention_for_cpu`)."""
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = {**core_aten_decompositions(), **get_decompositions(list(DECOMPOSED)),
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: _flash_attention_for_cpu}
    return {op: fn for op, fn in table.items() if op not in RESAMPLING}


def export_aten(module: torch.nn.Module, example_inputs: Sequence[Any]) -> tuple[torch.fx.GraphModule, dict]:
    """`torch.export` of `module` decomposed to core ATen: its GraphModule and the tensors of
    its parameters, buffers and constants by placeholder name."""
    from torch.export.graph_signature import InputKind

    with torch.no_grad():
        program = torch.export.export(module, tuple(example_inputs), strict=False)
        program = program.run_decompositions(decompositions())
    gm = program.graph_module
    for node in list(gm.graph.nodes):  # checks torch.export adds (dtype/shape asserts): nothing to run
        if node.op == "call_function" and node.target in _ASSERTIONS and not node.users:
            gm.graph.erase_node(node)
    tensors = {**program.state_dict, **program.constants}
    frozen = {
        spec.arg.name: tensors[spec.target]
        for spec in program.graph_signature.input_specs
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    }
    return gm, frozen


def from_torch(module: torch.nn.Module, example_inputs: Any, **options: Any) -> Graph:
    """The Graph of `module` for inference on inputs like `example_inputs` (a tensor or a
    tuple): core ATen, parameters and buffers frozen into constants (copied to the host from
    a GPU). The same rules build the graphs `torch.compile(module, backend="tilefold")` runs
    (before simplification). Options: `name` (the graph's name)."""
    unknown = set(options) - {"name"}
    if unknown:
        raise TypeError(f"from_torch: unknown options {sorted(unknown)}")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    gm, frozen = export_aten(module, inputs)
    bad = unsupported_nodes(gm, ANYTHING)
    if bad:
        node, reason = next(iter(bad.items()))
        ops = sorted({str(n.target) for n in bad})
        raise UnsupportedOpError(
            f"{type(module).__name__}: tilefold cannot convert {', '.join(ops)} "
            f"(first: fx node {node.name!r}: {reason}); torch.compile(backend='tilefold') runs such ops eagerly"
        )
    return graph_from_fx(gm, frozen, name=options.get("name", type(module).__name__), accepts=ANYTHING)


def tilefold_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The `torch.compile` backend named "tilefold" (see fx_backend.py); `options=` of
    torch.compile arrive as `options`."""
    from .fx_backend import tilefold_backend as _backend

    return _backend(gm, example_inputs, **kwargs)


def backend(**options: Any) -> Any:
    """A torch.compile backend with options (target, device, report): see fx_backend.backend."""
    from .fx_backend import backend as _backend

    return _backend(**options)


__all__ = ["SUPPORTED_OPS", "backend", "export_aten", "from_torch", "graph_from_fx", "tilefold_backend",
           "unsupported_nodes"]
