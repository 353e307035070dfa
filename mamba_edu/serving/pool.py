"""The state pool: every GDN layer's conv and SSM state for every slot, stacked.

Layout (``L`` GDN layers, ``S`` slots including the scratch slot)::

    conv: [L, S, D, W-1]    model dtype   the last W-1 raw (pre-conv) inputs of mixed_qkv
    ssm:  [L, S, HV, K, V]  fp32          the recurrent state

Stacking the layers lets one indexing op (one launch) copy a slot across all layers, which
a prefix hit and decode tracking do. Slot :data:`SCRATCH_SLOT` is reserved: sync-free code sends
the writes of rows that are not tracked there instead of skipping them (no mask, no sync).
"""

from __future__ import annotations

import torch

SCRATCH_SLOT = 0


def not_to(holder, owner) -> str:
    """``holder!r, not to owner!r`` for a refusal, saying so where the two are equal but not the same
    object (owners are compared by identity: ``f"req{i}"`` twice makes two owners)."""
    try:
        equal = bool(holder == owner)
    except Exception:  # noqa: BLE001 - an owner whose == raises (a tensor) is simply not equal
        equal = False
    twin = " (an equal but different object: owners are compared by identity, pass the same one)" if equal else ""
    return f"{holder!r}, not to {owner!r}{twin}"


class PoolExhausted(RuntimeError):
    """Raised when more slots are requested than are free; nothing was changed."""


def _is_int(value) -> bool:
    return type(value) is int


class StatePool:
    """Fixed-size pool of state slots with allocation bookkeeping on the host.

    Every allocated slot has an **owner**: whatever object was passed to :meth:`alloc` (``None``
    by default). :meth:`free` gives back only slots of the owner it is told, so a slot that an
    :class:`~mamba_edu.engine.Engine` or a :class:`~mamba_edu.serving.RadixCache` holds cannot be
    freed by anyone else; :meth:`transfer` hands slots from one owner to another.

    Args:
        n_layers: number of GDN layers ``L``.  capacity: usable slots (the scratch slot is extra).
        conv_dim: ``D = 2·H·K + HV·V``.  conv_width: ``W``.  value_heads, key_dim, value_dim: HV, K, V.
        device, conv_dtype: where and in which dtype the conv states live (SSM states are fp32).
    """

    def __init__(self, n_layers: int, capacity: int, conv_dim: int, conv_width: int, value_heads: int,
                 key_dim: int, value_dim: int, device="cpu", conv_dtype=torch.float32):
        for name, value, minimum in (("n_layers", n_layers, 0), ("capacity", capacity, 1),
                                     ("conv_dim", conv_dim, 1), ("conv_width", conv_width, 2),
                                     ("value_heads", value_heads, 1), ("key_dim", key_dim, 1),
                                     ("value_dim", value_dim, 1)):
            if not _is_int(value) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
        if not isinstance(conv_dtype, torch.dtype) or not conv_dtype.is_floating_point:
            raise ValueError(f"conv_dtype must be a floating torch dtype; got {conv_dtype!r}")
        slots = capacity + 1
        self.conv = torch.zeros(n_layers, slots, conv_dim, conv_width - 1, device=device, dtype=conv_dtype)
        self.ssm = torch.zeros(n_layers, slots, value_heads, key_dim, value_dim, device=device,
                               dtype=torch.float32)
        self.capacity = capacity
        self._layers = list(zip(self.conv, self.ssm))  # per-layer views, made once (see layer())
        self._free = list(range(slots - 1, SCRATCH_SLOT, -1))  # pop() hands out low slots first
        self._owner: dict[int, object] = {}  # allocated slot -> its owner

    @classmethod
    def for_model(cls, config, capacity: int, device, conv_dtype) -> StatePool:
        """A pool shaped for a :class:`mamba_edu.model.ModelConfig`."""
        return cls(len(config.gdn_layers), capacity, config.conv_dim, config.conv_width,
                   config.gdn_value_heads, config.gdn_key_dim, config.gdn_value_dim, device, conv_dtype)

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_layers(self) -> int:
        return self.conv.shape[0]

    def used_slots(self) -> set[int]:
        """The slots currently allocated (a copy)."""
        return set(self._owner)

    def is_allocated(self, slot) -> bool:
        """Whether ``slot`` is an allocated slot (the scratch slot never is)."""
        return _is_int(slot) and slot in self._owner

    def owner_of(self, slot):
        """The owner ``slot`` was allocated to (``ValueError`` if it is not allocated)."""
        self._check_slots("slot", [slot])
        return self._owner[slot]

    def alloc(self, n: int, owner=None) -> list[int]:
        """Take ``n`` free slots for ``owner`` and zero their states (a fresh sequence starts
        from zeros). Raises :class:`PoolExhausted`, changing nothing, when fewer than ``n`` are free.
        """
        if not _is_int(n) or n < 0:
            raise ValueError(f"n must be an int >= 0; got {n!r}")
        if n > len(self._free):
            raise PoolExhausted(f"state pool exhausted: {n} slots requested, {len(self._free)} free "
                                f"of capacity {self.capacity}; free requests or cache entries first")
        slots = self._free[len(self._free) - n:][::-1]
        if slots:
            idx = torch.tensor(slots, device=self.conv.device)
            self.conv[:, idx] = 0
            self.ssm[:, idx] = 0
        del self._free[len(self._free) - n:]  # after the device work: a failure there takes nothing
        self._owner.update(dict.fromkeys(slots, owner))
        return slots

    def peek(self, n: int, extra=()) -> list[int]:
        """The slots :meth:`alloc` would hand out for ``n`` if the allocated slots ``extra`` were
        freed first (nothing changes)."""
        if not _is_int(n) or n < 0:
            raise ValueError(f"n must be an int >= 0; got {n!r}")
        return sorted([*self._free, *self._check_slots("extra", extra)])[:n]

    def _check_slots(self, name: str, slots, owner=None, check_owner: bool = False) -> list[int]:
        if isinstance(slots, (str, bytes)) or not isinstance(slots, (list, tuple, set, frozenset)):
            raise ValueError(f"{name} must be a list of slot ints; got {type(slots).__name__}")
        slots = list(slots)
        bad = [s for s in slots if not self.is_allocated(s)]
        if bad or len(set(slots)) != len(slots):
            raise ValueError(f"{name} must be distinct allocated slots (ints); got {slots} "
                             f"(not allocated: {bad})")
        if check_owner:
            foreign = [s for s in slots if self._owner[s] is not owner]
            if foreign:
                raise ValueError(f"{name} {foreign} belong to {not_to(self._owner[foreign[0]], owner)}: only a "
                                 f"slot's owner gives it back")
        return slots

    def free(self, slots: list[int], owner=None) -> None:
        """Return ``owner``'s slots to the pool. Raises ``ValueError``, freeing nothing, unless
        ``slots`` are distinct slots allocated to ``owner`` (ints; the scratch slot is never
        allocated)."""
        slots = self._check_slots("slots", slots, owner, check_owner=True)
        for s in slots:
            del self._owner[s]
        self._free.extend(slots)
        self._free.sort(reverse=True)

    def transfer(self, slots: list[int], owner, new_owner) -> None:
        """Hand ``owner``'s ``slots`` to ``new_owner`` (checked whole first)."""
        slots = self._check_slots("slots", slots, owner, check_owner=True)
        self._owner.update(dict.fromkeys(slots, new_owner))

    def copy_slot(self, src: int, dst: int, owner=None) -> None:
        """Copy slot ``src``'s conv and SSM states into ``dst``, all layers at once; ``dst`` must
        be ``owner``'s (a cached snapshot is the cache's: nobody else writes it)."""
        for s, name in ((src, "src"), (dst, "dst")):
            if not self.is_allocated(s):
                raise ValueError(f"{name} must be an allocated slot; got {s!r}")
        if self._owner[dst] is not owner:
            raise ValueError(f"dst {dst} belongs to {not_to(self._owner[dst], owner)}: only a slot's owner "
                             f"writes it")
        if src == dst:
            return
        self.conv[:, dst] = self.conv[:, src]
        self.ssm[:, dst] = self.ssm[:, src]

    def clear(self) -> None:
        """Free every slot, whoever owns it, and zero every state (an engine's ``reset``)."""
        self.conv.zero_()
        self.ssm.zero_()
        self._free = list(range(self.capacity, SCRATCH_SLOT, -1))
        self._owner.clear()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(conv [S, D, W-1], ssm [S, HV, K, V])`` of one GDN layer (writes go to the pool);
        ``index`` in ``[0, n_layers)`` (no negative indexing)."""
        if not _is_int(index) or not 0 <= index < len(self._layers):
            raise ValueError(f"layer index must be an int in [0, {len(self._layers)}) (a GDN layer's "
                             f"gdn_index); got {index!r}")
        return self._layers[index]
