"""tppasm: Tensor Processing Primitives JIT-emitted as machine code, callable on NumPy arrays.

>>> import tppasm
>>> isinstance(tppasm.__version__, str)
True
"""
__version__ = "0.1.0"       # setup.cfg reads it from here

from .kernel import get_kernel  # noqa: F401,E402
from .brgemm import brgemm, tileconfig, tilerelease  # noqa: F401,E402
from .layout import aligned, block, empty, unblock, vnni_pack, vnni_unpack  # noqa: F401,E402
from .eltwise import binary, copy, reduce, relu, ternary, transform, unary, zero  # noqa: F401,E402
