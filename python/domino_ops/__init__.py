"""domino_ops: kernels for Domino speculative decoding.

Ops (each also as a pure-PyTorch reference in :mod:`domino_ops.reference` and as a
dispatcher op ``torch.ops.domino_ops.<name>`` with caller-provided outputs):

- :func:`domino_head_rollout`: the Domino head's k sequential correction + GRU steps.
- :func:`sample`: temperature / top-k / top-p sampling of a row of logits.
- :func:`verify_greedy`: greedy verification of a draft block.
- :func:`verify_sampling`: lossless rejection-sampling verification.
"""

import torch

from domino_ops import _C  # registers torch.ops.domino_ops.*

if _C.torch_version != torch.__version__:
    raise ImportError(
        f"domino_ops was compiled against torch {_C.torch_version} but torch {torch.__version__} "
        "is imported; rebuild it (pip install --no-build-isolation .) against this torch")

from domino_ops import _fake, reference  # noqa: E402,F401
from domino_ops.ops import domino_head_rollout, has_kernel, sample, verify_greedy, verify_sampling  # noqa: E402

cuda_compiled: bool = _C.cuda_compiled
__version__ = "0.1.0"
__all__ = ["domino_head_rollout", "sample", "verify_greedy", "verify_sampling", "has_kernel", "reference",
           "cuda_compiled"]
