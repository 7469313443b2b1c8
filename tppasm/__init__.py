"""tppasm: Tensor Processing Primitives JIT-emitted as machine code, callable on NumPy arrays.

>>> import tppasm
>>> isinstance(tppasm.__version__, str)
True
"""
from .version import __version__  # noqa: F401
from .kernel import ISAUnavailableError, cache_clear, get_kernel, set_kernel_cache_limit  # noqa: F401
from .brgemm import brgemm  # noqa: F401
from .tiles import tileconfig, tilerelease  # noqa: F401
from .buffers import set_buffer_cache_limit  # noqa: F401
from .layout import aligned, block, empty, nblocks, unblock, vnni_pack, vnni_unpack  # noqa: F401
from .eltwise import binary, copy, reduce, relu, ternary, transform, unary, zero  # noqa: F401,E402
from .norm import layernorm, rmsnorm, softmax  # noqa: F401,E402
from .rotary import rope_tables, rotary  # noqa: F401,E402
from .quant import dequant, quantize  # noqa: F401,E402
from .glu import swiglu  # noqa: F401,E402
from .gemm_nt import gemm_nt  # noqa: F401,E402
from .spmm import block_spmm  # noqa: F401,E402
