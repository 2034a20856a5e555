"""The ONNX writer: an optimized (or plain) Graph as a standard ONNX model that onnxruntime
runs, annotated so that `tilefold.load` gives the same graph back.

    save_onnx(graph, "model.opt.onnx")   # lower.py: Graph -> ModelProto; write.py: the file
"""
from .lower import Lowered, anchor_tiles, lower
from .write import EXTERNAL_THRESHOLD, Written, check_output_path, save_onnx

__all__ = ["EXTERNAL_THRESHOLD", "Lowered", "Written", "anchor_tiles", "check_output_path", "lower", "save_onnx"]
