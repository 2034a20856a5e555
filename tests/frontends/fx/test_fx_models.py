"""transformers models (from config, random weights, no download) through
torch.compile(backend="tilefold") against eager PyTorch, and their layout reports.

Tolerance: float32 through ~100 ops in a different order than PyTorch's: |diff| <= 1e-4 *
max|eager| + 1e-5 (measured ~1e-6 relative)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


def _bert():
    return transformers.BertModel(transformers.BertConfig()), lambda rng: (
        torch.from_numpy(rng.integers(0, 30522, (1, 64))),
        torch.from_numpy(np.concatenate([np.ones((1, 48), np.int64), np.zeros((1, 16), np.int64)], 1)))


def _gpt2():
    return transformers.GPT2Model(transformers.GPT2Config(use_cache=False)), lambda rng: (
        torch.from_numpy(rng.integers(0, 50257, (1, 32))),)


def _vit():
    return transformers.ViTModel(transformers.ViTConfig()), lambda rng: (
        torch.from_numpy(rng.standard_normal((1, 3, 224, 224)).astype(np.float32)),)


def _resnet():
    return transformers.ResNetForImageClassification(transformers.ResNetConfig()), lambda rng: (
        torch.from_numpy(rng.standard_normal((1, 3, 224, 224)).astype(np.float32)),)


def _first(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("build", [_bert, _gpt2, _vit, _resnet], ids=["bert-base", "gpt2", "vit-base", "resnet-50"])
def test_transformers_model_runs_wholly_on_tilefold_as_eager_with_no_runtime_layout_op(build):
    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    reports = []
    compiled = torch.compile(model, backend="tilefold", options={"report": reports.append})
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for _ in range(2):
            args = inputs(rng)
            got, want = _first(compiled(*args)), _first(model(*args))
            scale = float(want.abs().max())
            torch.testing.assert_close(got, want, atol=1e-4 * scale + 1e-5, rtol=0)
    assert reports and all(not r.fallback for r in reports)
    assert sum(r.optimized.report.to_dict()["layout_ops_after"] for r in reports) == 0


@pytest.mark.parametrize("build, left", [(_bert, 1), (_gpt2, 0), (_vit, 1)], ids=["bert-base", "gpt2", "vit-base"])
def test_transformers_model_on_the_gpu_target_moves_no_data_inside_its_layers(build, left):
    """16x16 tiles where they divide: BERT's mask is packed once for all layers; ViT's 197
    tokens stay untiled (its hidden dim in tiles of 16, which its Linear layers read),
    and what its patch embedding (NCHWc16 conv) writes is unpacked once, before the first
    layer. (73, 72 and 98 were left before the gpu target stopped tiling dims the tile does
    not divide and matmuls learned to write the attention context in the layout its head merge
    reads; ViT 2 before Gemms read tiles of one matrix dim.)"""
    from tilefold.frontends.fx_backend import backend

    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    reports = []
    compiled = torch.compile(model, backend=backend(target="gpu", report=reports.append))
    with torch.no_grad():
        args = inputs(np.random.default_rng(1))
        got, want = _first(compiled(*args)), _first(model(*args))
    torch.testing.assert_close(got, want, atol=1e-4 * float(want.abs().max()) + 1e-5, rtol=0)
    assert reports and all(not r.fallback for r in reports)
    assert sum(r.optimized.report.to_dict()["layout_ops_after"] for r in reports) == left
