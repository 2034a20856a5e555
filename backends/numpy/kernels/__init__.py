"""NumPy kernels, one module per op family; importing this package registers them."""
