"""Whole models through the writer: onnxruntime on the optimized file gives onnxruntime's
outputs on the original, on fresh random inputs, for both targets and both ONNX forms (the gpu
target's padded tiles exercise the Transpose/Reshape/Slice lowering of packed weights, and in
the packed form the Pad/Reshape/Transpose of runtime packs); the file reloads as the same graph."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import tilefold
from tilefold.bench.models import LIGHT_MODELS, light_model, random_inputs
from tilefold.frontends.onnx import load_onnx

QUICK = ("squeezenet", "shufflenet")
TARGETS = ("cpu", "gpu")
FORMS = ("auto", "packed")


def _check_model(source: Path, feeds: dict, tmp_path: Path, target: str, ort_run, facts,
                 rtol: float = 1e-4, atol: float = 1e-5, form: str = "auto") -> None:
    optimized = tilefold.optimize(source, target)
    out = tmp_path / f"{source.stem}.{target}.{form}.onnx"
    tilefold.save(optimized, out, form=form)
    want = ort_run(source, feeds)
    got = ort_run(out, feeds)
    assert got.keys() == want.keys()
    for name in want:
        scale = float(np.max(np.abs(want[name]))) or 1.0
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol * scale, err_msg=name)
    assert facts(load_onnx(out)) == facts(optimized.graph)
    again = tilefold.optimize(out, target)
    assert again.report.pass_seconds == {} and facts(again.graph) == facts(optimized.graph)


def _light(name: str, tmp_path: Path) -> tuple[Path, dict]:
    model = light_model(name, random_weights=True, seed=1)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path, random_inputs(model, np.random.default_rng(7))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", QUICK)
def test_light_model_quick(name, target, form, tmp_path, ort_run, facts):
    path, feeds = _light(name, tmp_path)
    _check_model(path, feeds, tmp_path, target, ort_run, facts, form=form)


HEAVY = ("vgg19", "zfnet512", "bvlc_alexnet")
"""60M to 144M parameters: a minute per file (written, reloaded, run twice) on two cores, so
these take two of the four (target, form) pairs, which cover both targets and both forms."""
PAIRS = [(t, f) for t in TARGETS for f in FORMS]


@pytest.mark.slow
@pytest.mark.parametrize("name, target, form", [
    (name, target, form) for name in LIGHT_MODELS if name not in QUICK for target, form in PAIRS
    if name not in HEAVY or (target, form) in (("cpu", "packed"), ("gpu", "auto"))])
def test_light_model(name, target, form, tmp_path, ort_run, facts):
    path, feeds = _light(name, tmp_path)
    _check_model(path, feeds, tmp_path, target, ort_run, facts, form=form)


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("target", TARGETS)
def test_resnet50_export(target, form, tmp_path, ort_run, facts):
    from tilefold.bench.models import resnet50, resnet50_inputs

    _check_model(resnet50(), resnet50_inputs(np.random.default_rng(3)), tmp_path, target, ort_run, facts, form=form)


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("target", TARGETS)
def test_bert_export(target, form, tmp_path, ort_run, facts):
    from tilefold.bench.models import bert, bert_inputs

    _check_model(bert(), bert_inputs(np.random.default_rng(3)), tmp_path, target, ort_run, facts, form=form)
