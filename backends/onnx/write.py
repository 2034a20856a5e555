"""Writing a lowered model to disk: never a half-written file, the 2 GB limit respected.

The model goes to a temporary file beside the output, is checked there with
`onnx.checker.check_model(path, full_check=True)`, and only then renamed over the output:
a failure at any step leaves the old output untouched and no temporary file behind.
Weights beyond `external_threshold` bytes in all go to one external data file (protobuf
cannot serialize 2 GB). Its name carries a fresh token (`model.onnx.<token>.data`), so the
old model keeps its own data file until the rename switches to the new pair; the data files
of earlier writes are removed after it.
"""
from __future__ import annotations

import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from tqdm import tqdm

from ...graph.errors import TilefoldError
from ...graph.graph import Graph
from .lower import lower

FORMS = ("auto", "logical", "packed")
AUTO_FORM = "logical"
"""What `form="auto"` writes: onnxruntime ran the logical form as fast as the original and
the packed form slower (bench/onnx_out.py), so the logical form it is, for every model."""

EXTERNAL_THRESHOLD = 1_800_000_000
"""Weight bytes beyond which the weights go to an external data file (protobuf's limit is 2 GiB)."""


@dataclass
class Written:
    """What `save_onnx` wrote: the file, its external data file (if any), sizes and times."""

    path: Path
    data_path: Path | None
    file_bytes: int
    weight_bytes: int
    onnx_ops: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)


def save_onnx(
    graph: Graph,
    path: str | os.PathLike,
    *,
    progress: bool = False,
    form: str = "auto",
    external_threshold: int = EXTERNAL_THRESHOLD,
    check: bool = True,
) -> Written:
    """Write `graph` as a standard ONNX model that onnxruntime runs and `load_onnx` reads back.

    `form`: "logical" (every op on logical values; packed weights stored packed and unpacked
    by ops onnxruntime folds at session creation), "packed" (values in their packed buffers,
    the plan's layout changes as real ops: backends/onnx/packed.py) or "auto" (`AUTO_FORM`,
    the one onnxruntime runs fastest). `check` runs the full onnx checker on the written file.
    """
    if form not in FORMS:
        raise TilefoldError(f"unknown ONNX form {form!r}: choose one of {', '.join(FORMS)}")
    path = Path(path)
    directory = check_output_path(path)
    times: dict[str, float] = {}
    start = time.perf_counter()
    lowered = lower(graph, form=AUTO_FORM if form == "auto" else form, progress=progress)
    times["lower"] = time.perf_counter() - start
    external = lowered.weight_bytes > external_threshold
    location = f"{path.name}.{secrets.token_hex(4)}.data" if external else None
    data_path = directory / location if location else None
    try:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        raise TilefoldError(f"cannot write {path}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        start = time.perf_counter()
        with tqdm(total=1, desc=f"saving {path.name}", file=sys.stderr, disable=not progress) as bar:
            _save(lowered.model, tmp, location, path)
            bar.update(1)
        times["save"] = time.perf_counter() - start
        if check:
            start = time.perf_counter()
            _check(tmp, path)
            times["check"] = time.perf_counter() - start
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if data_path is not None:
            data_path.unlink(missing_ok=True)
        raise
    _remove_stale_data(path, keep=location)
    return Written(path, data_path, path.stat().st_size + (data_path.stat().st_size if data_path else 0),
                   lowered.weight_bytes, lowered.onnx_ops, times)


def check_output_path(path: str | os.PathLike) -> Path:
    """The folder `path` will be written in; a one-line TilefoldError when it cannot be."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise TilefoldError(f"cannot write {path}: it is a directory")
    if not directory.exists():
        raise TilefoldError(f"cannot write {path}: no such directory {directory}")
    if not directory.is_dir():
        raise TilefoldError(f"cannot write {path}: {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TilefoldError(f"cannot write {path}: directory {directory} is not writable")
    return directory


def _save(model: onnx.ModelProto, tmp: Path, location: str | None, path: Path) -> None:
    try:
        if location is None:
            onnx.save_model(model, tmp)
        else:
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=location, size_threshold=1024, convert_attribute=False)
    except OSError as exc:
        raise TilefoldError(f"cannot write {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # protobuf's 2 GB limit
        raise TilefoldError(f"cannot serialize the model: {str(exc).splitlines()[0]}; lower external_threshold") \
            from None


def _check(tmp: Path, path: Path) -> None:
    try:
        onnx.checker.check_model(str(tmp), full_check=True)
    except Exception as exc:  # onnx raises ValidationError / InferenceError with multi-line text
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise TilefoldError(f"the ONNX model written for {path} fails onnx.checker: {first}") from None


def _file_mode(path: Path) -> int:
    """The old output's mode, else what `open` would give a new file (mkstemp makes it 0600)."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _remove_stale_data(path: Path, keep: str | None) -> None:
    """Data files of earlier writes to `path` (named `path.<token>.data`) that the new file no longer uses."""
    for old in path.parent.glob(f"{path.name}.*.data"):
        if old.name != keep and len(old.name) == len(path.name) + 14:
            old.unlink(missing_ok=True)
