"""Built-in op entries; importing this package registers them."""
from . import core  # noqa: F401
