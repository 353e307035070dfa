"""mamba_edu: prefill a hybrid Gated DeltaNet model and track its recurrent states, step by step.

Subpackages: :mod:`mamba_edu.gdn` (the math), :mod:`mamba_edu.kernels` (Triton),
:mod:`mamba_edu.serving` (pool, prefix cache, tracking strategies), :mod:`mamba_edu.model`,
:mod:`mamba_edu.profiling`. Importing the package selects the Triton interpreter when no GPU is
present (see :mod:`mamba_edu._runtime`).
"""

from mamba_edu._runtime import (data_dir, default_device, needs_triton, triton_available,
                                triton_interpreted)

__version__ = "0.1.0"
__all__ = ["data_dir", "default_device", "needs_triton", "triton_available", "triton_interpreted",
           "__version__"]
