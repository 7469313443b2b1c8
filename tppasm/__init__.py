"""tppasm: Tensor Processing Primitives JIT-emitted as machine code, callable on NumPy arrays."""
from .kernel import get_kernel  # noqa: F401
from .brgemm import brgemm, tileconfig, tilerelease  # noqa: F401
from .layout import aligned, block, empty, nblocks, unblock, vnni_pack, vnni_unpack  # noqa: F401
from .eltwise import binary, copy, reduce, relu, ternary, transform, unary, zero  # noqa: F401,E402
