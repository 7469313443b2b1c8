"""tppasm kernels as torch operators: ``torch.ops.tppasm.linear`` (a fully connected layer with
fused bias and activation, forward and backward on TPPs), :func:`linear` and the module
:class:`Linear`, usable in training, in ``nn.Module``s, under ``torch.compile`` (where the
operators are opaque custom ops with fake kernels), CPU autocast and ``torch.func.grad``.
Importing this module imports torch; ``import tppasm`` alone never does. It also has
the process pool's regions (:mod:`tppasm.fc`'s multi-threaded products, loop nests) run on
torch's OpenMP threads (:func:`isa.pool.share_openmp_threads`), which otherwise spin beside them
after each torch operator; ``isa.pool.share_openmp_threads(False)`` undoes that.

>>> import torch, tppasm.torch as tt
>>> layer = tt.Linear(3, 2, act="relu")
>>> y = layer(torch.ones(4, 3)); y.sum().backward(); list(layer.weight.grad.shape)
[2, 3]
"""
try:
    import torch  # noqa: F401
except ImportError as e:         # pragma: no cover - the message is the point
    raise ModuleNotFoundError("tppasm.torch needs torch: pip install torch (the tppasm bench and test extras pin "
                              "torch==2.13.0, the CPU build)", name="torch") from e

from isa.pool import share_openmp_threads  # noqa: E402

from .nn import Linear  # noqa: E402
from .ops import ACTS, linear  # noqa: E402

share_openmp_threads()

__all__ = ["ACTS", "Linear", "linear"]
