"""Reading an ONNX file with its large weights going straight into NumPy arrays.

Parsing a model with protobuf copies every weight into protobuf's memory, and reading a
tensor's `raw_data` from Python copies it again: with the read of the file itself, three
copies of each weight (ResNet-50: 0.11 s of a 0.16 s load; each copy of its 94 MB into
fresh memory pays some 23,000 page faults). `read_split` walks the protobuf wire format of
the file along one path only, model -> graph (field 7) -> initializer (5) -> raw_data (9),
and reads each `raw_data` payload of at least `min_bytes` with one read into an array of
its own; everything else (nodes, types, small tensors: a few hundred KB) is kept as bytes
and parsed by protobuf as usual. `attach` then gives each held-out payload its dtype and
shape from the parsed tensor, which keeps its name, dims and type but no data.
`read_external` does the same for an initializer kept in an external data file.

Anything the walk does not expect (the graph field twice, a tensor's raw_data twice, a
group wire type, a length past its message or the file) makes `read_split` answer None,
and the caller reads the file the ordinary way: this is a fast path, never a second
parser to trust.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import onnx
from onnx import external_data_helper

_GRAPH = 7 << 3 | 2  # ModelProto.graph, length-delimited
_INITIALIZER = 5 << 3 | 2  # GraphProto.initializer
_RAW_DATA = 9 << 3 | 2  # TensorProto.raw_data
_CHUNK = 1 << 16

T = onnx.TensorProto
_PLAIN = {
    T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16, T.BOOL: np.bool_,
    T.INT8: np.int8, T.INT16: np.int16, T.INT32: np.int32, T.INT64: np.int64,
    T.UINT8: np.uint8, T.UINT16: np.uint16, T.UINT32: np.uint32, T.UINT64: np.uint64,
}
"""Element types whose raw_data is the little-endian array itself (as numpy_helper reads it)."""


class _Unexpected(Exception):
    """The file is not laid out as the walk expects: read it the ordinary way."""


@dataclass
class Split:
    """A model file as protobuf bytes without the held-out payloads, and those payloads."""

    light: bytes
    payloads: dict[int, np.ndarray]  # index into graph.initializer -> raw bytes (uint8)


def read_split(f: BinaryIO, min_bytes: int) -> Split | None:
    """Read the model in `f` (an unbuffered binary file at offset 0), holding out every
    initializer's raw_data of at least `min_bytes`; None when the walk cannot tell."""
    if sys.byteorder != "little":
        return None
    reader = _Reader(f)
    try:
        light = _model(reader, min_bytes)
    except _Unexpected:
        return None
    return Split(light, reader.payloads)


def attach(model: onnx.ModelProto, payloads: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """The held-out payloads as arrays by initializer name. A payload whose tensor is not a
    plain array (another element type, a size that does not match its dims, a name used
    twice) goes back into the tensor's raw_data instead, for numpy_helper to read."""
    initializers = model.graph.initializer
    unique = len({t.name for t in initializers}) == len(initializers)
    arrays: dict[str, np.ndarray] = {}
    for index, payload in payloads.items():
        tensor = initializers[index]
        shape = plain_shape(tensor)
        if unique and shape is not None and tensor.data_location != T.EXTERNAL and shape[1] == payload.nbytes:
            arrays[tensor.name] = payload.view(shape[0]).reshape(shape[2])
        else:
            tensor.raw_data = payload.tobytes()
    return arrays


def plain_shape(tensor: onnx.TensorProto) -> tuple[np.dtype, int, tuple[int, ...]] | None:
    """(dtype, bytes, dims) of a tensor whose bytes are a plain little-endian array, else None."""
    if tensor.data_type not in _PLAIN or tensor.HasField("segment"):
        return None
    dtype = np.dtype(_PLAIN[tensor.data_type])
    dims = tuple(int(d) for d in tensor.dims)
    return dtype, int(np.prod(dims, dtype=np.int64)) * dtype.itemsize, dims


def read_external(tensor: onnx.TensorProto, base_dir: str) -> np.ndarray | None:
    """An initializer kept in an external file (its location already checked), read with one
    read into an array of its own: onnx's loader reads it into the tensor's raw_data, from
    which numpy_helper copies it again. None where onnx's loader is to read it: not a plain
    array, a length that does not match its dims, a symbolic link on the way (onnx refuses
    those), or a file shorter than it says."""
    shape = plain_shape(tensor)
    if shape is None or sys.byteorder != "little":
        return None
    dtype, nbytes, dims = shape
    info = external_data_helper.ExternalDataInfo(tensor)
    path = os.path.join(base_dir, info.location)
    if (info.length and int(info.length) != nbytes) or os.path.realpath(path) != os.path.abspath(path):
        return None
    array = np.empty(nbytes, np.uint8)
    view = memoryview(array)
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(int(info.offset or 0))
            done = 0
            while done < nbytes:
                got = f.readinto(view[done:])
                if not got:
                    return None
                done += got
    except OSError:
        return None  # onnx's loader is to say what is wrong
    return array.view(dtype).reshape(dims)


# ---- the walk ---------------------------------------------------------------------------------
def _model(r: _Reader, min_bytes: int) -> bytes:
    out: list[bytes] = []
    graphs = 0
    while not r.at_end():
        key = r.varint()
        if key != _GRAPH:
            _copy_field(r, key, out, None)
            continue
        graphs += 1
        if graphs > 1:
            raise _Unexpected  # repeated message fields merge; not worth following
        end = r.end_of(r.varint(), None)
        body = _graph(r, end, min_bytes)
        out += [_varint(key), _varint(len(body)), body]
    return b"".join(out)


def _graph(r: _Reader, end: int, min_bytes: int) -> bytes:
    out: list[bytes] = []
    index = 0
    while r.pos < end:
        key = r.varint()
        if key != _INITIALIZER:
            _copy_field(r, key, out, end)
            continue
        size = r.varint()
        stop = r.end_of(size, end)
        if size < min_bytes:
            out += [_varint(key), _varint(size), r.take(size)]
        else:
            body = _tensor(r, stop, min_bytes, index)
            out += [_varint(key), _varint(len(body)), body]
        index += 1
    r.expect(end)
    return b"".join(out)


def _tensor(r: _Reader, end: int, min_bytes: int, index: int) -> bytes:
    out: list[bytes] = []
    raw_fields = 0
    while r.pos < end:
        key = r.varint()
        if key != _RAW_DATA:
            _copy_field(r, key, out, end)
            continue
        raw_fields += 1
        if raw_fields > 1:
            raise _Unexpected  # the last one would win
        size = r.varint()
        r.end_of(size, end)
        if size < min_bytes:
            out += [_varint(key), _varint(size), r.take(size)]
        else:
            r.payloads[index] = r.take_array(size)
    r.expect(end)
    return b"".join(out)


def _copy_field(r: _Reader, key: int, out: list[bytes], end: int | None) -> None:
    """One field, as it is (its tag and length encoded again, minimally)."""
    kind = key & 7
    out.append(_varint(key))
    if kind == 0:
        out.append(_varint(r.varint()))
    elif kind == 1:
        out.append(r.take(8))
    elif kind == 5:
        out.append(r.take(4))
    elif kind == 2:
        size = r.varint()
        r.end_of(size, end)
        out += [_varint(size), r.take(size)]
    else:
        raise _Unexpected  # groups (3, 4) are not in onnx.proto; anything else is not protobuf
    if end is not None and r.pos > end:
        raise _Unexpected


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class _Reader:
    """Sequential reads from an unbuffered file: small ones through a chunk buffer, payloads
    with `readinto` straight into their arrays."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = os.fstat(f.fileno()).st_size
        self.buf = b""
        self.off = 0
        self.pos = 0  # file offset of buf[off]
        self.eof = False
        self.payloads: dict[int, np.ndarray] = {}

    def _fill(self, n: int) -> None:
        """Buffer at least n bytes ahead, fewer only at the end of the file."""
        have = len(self.buf) - self.off
        if have >= n or self.eof:
            return
        more = self.f.read(max(n - have, _CHUNK))
        if not more:
            self.eof = True
        self.buf = self.buf[self.off:] + more
        self.off = 0
        if len(self.buf) < n and not self.eof:
            self._fill(n)

    def at_end(self) -> bool:
        self._fill(1)
        return self.off >= len(self.buf)

    def varint(self) -> int:
        self._fill(10)
        buf, i = self.buf, self.off
        result = shift = 0
        while True:
            if i >= len(buf) or shift > 63:
                raise _Unexpected
            byte = buf[i]
            i += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        self.pos += i - self.off
        self.off = i
        return result

    def end_of(self, size: int, end: int | None) -> int:
        """Where a field of `size` bytes starting here ends; it must fit in its message (or
        the file)."""
        stop = self.pos + size
        if stop > (self.size if end is None else end):
            raise _Unexpected
        return stop

    def expect(self, end: int) -> None:
        if self.pos != end:
            raise _Unexpected

    def take(self, n: int) -> bytes:
        self._fill(n)
        if len(self.buf) - self.off < n:
            raise _Unexpected  # the file ends inside the field
        data = self.buf[self.off:self.off + n]
        self.off += n
        self.pos += n
        return data

    def take_array(self, n: int) -> np.ndarray:
        array = np.empty(n, np.uint8)
        view = memoryview(array)
        head = min(n, len(self.buf) - self.off)
        view[:head] = self.buf[self.off:self.off + head]
        self.off += head
        done = head
        while done < n:
            got = self.f.readinto(view[done:])
            if not got:
                raise _Unexpected
            done += got
        self.pos += n
        return array
