"""NumPy kernels, one module per op family; importing this package registers them."""
from . import elementwise, fallback, linalg, nn, quantize, reduce, resize, scatter, tensor  # noqa: F401
