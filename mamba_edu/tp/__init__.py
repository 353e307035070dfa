"""Tensor parallelism over ``torch.distributed``, at the model level (issue 32).

A rank's model is a :class:`~mamba_edu.tp.model.TPHybridModel`: the seeded full model's weights
sliced for that rank (GDN and attention heads split, column-parallel in-projections, row-parallel
out-projections followed by an all-reduce, vocabulary-parallel embedding and LM head). The
:class:`~mamba_edu.engine.Engine` runs on it unchanged: its config reports this rank's head
counts, so the state pool holds this rank's heads only. Every rank runs the same requests, so
the prefix cache and the planning (track positions, slots, prefix hits) are the same on every
rank: they are deterministic functions of the requests and need no broadcast.

* :mod:`mamba_edu.tp.model`: the sharding (:func:`shard_model`, :func:`build_tp_model`,
  :func:`tp_config`, :func:`check_tp`).
* :mod:`mamba_edu.tp.launch`: :func:`launch` starts N ranks on this machine (spawn, gloo on a
  free localhost port, or NCCL on GPUs) with timeouts, so a failing rank never leaves the others
  hanging.
* :mod:`mamba_edu.tp.check`: the 2-rank-vs-1-rank comparison that ``demo --tp N`` prints.
"""

from mamba_edu.tp.model import (TPHybridModel, TPShapes, build_tp_model, check_tp, shard_model,
                                tp_config)

__all__ = ["TPHybridModel", "TPShapes", "build_tp_model", "check_tp", "shard_model", "tp_config"]
