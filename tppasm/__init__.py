"""tppasm: Tensor Processing Primitives JIT-emitted as machine code, callable on NumPy arrays."""
from .kernel import get_kernel  # noqa: F401
