"""Graph -> Graph passes and the pipeline that runs them."""
from .cse import cse
from .dce import dce
from .einsum import lower_einsum
from .fold import constant_folding, fold_batchnorm
from .pads import fold_pads
from .pipeline import Pass, PassResult, PipelineLog, graph_pass, run_passes, simplify
from .shuffles import compose_shuffles
from .transposes import compose_transposes

__all__ = [
    "Pass", "PassResult", "PipelineLog", "compose_shuffles", "compose_transposes", "constant_folding", "cse", "dce",
    "fold_batchnorm", "fold_pads", "graph_pass", "lower_einsum", "run_passes", "simplify",
]
