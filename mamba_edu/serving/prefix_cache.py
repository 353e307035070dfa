"""A radix tree over token ids whose nodes hold recurrent-state snapshots (and attention KV).

A recurrent state cannot be rewound, so a cached prefix is usable only up to a node that holds
a **snapshot slot**: the (conv, SSM) states of every GDN layer after exactly that many tokens.
Nodes without one (left behind when an edge is split) are only paths to deeper snapshots.

Every node also keeps the attention layers' KV of its edge tokens (``kv[layer] = (k, v)``,
``[edge_len, kv_heads, head_dim]`` each), so a hit hands the attention layers their prefix.
Snapshots in use are locked (reference counts); eviction frees least-recently-used unlocked
leaves and returns their slots to the pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from mamba_edu.serving.pool import SCRATCH_SLOT


@dataclass(eq=False)
class RadixNode:
    """One edge of the tree: the tokens from the parent's end to this node's end."""

    tokens: tuple[int, ...]
    parent: RadixNode | None
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    slot: int | None = None
    refcount: int = 0
    last_used: int = 0
    children: dict[int, RadixNode] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        """Number of tokens from the root to the end of this node."""
        n, node = 0, self
        while node is not None:
            n, node = n + len(node.tokens), node.parent
        return n


@dataclass
class PrefixMatch:
    """The longest usable cached prefix of a request.

    ``length`` tokens (0 = miss); ``node`` holds the snapshot (``slot``), or is the root on a miss;
    ``kv``: per attention layer ``(k, v)`` ``[length, kv_heads, head_dim]``, or None on a miss.
    """

    length: int
    node: RadixNode
    slot: int | None
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None


class RadixCache:
    """Prefix cache. ``pool`` is the :class:`StatePool` whose slots the snapshots occupy.

    ``working_slots``: called by :meth:`insert`, returns the slots that forwards write now (an
    engine's running requests' and prepared batches' working slots); none of them may become a
    snapshot. Without it, only the pool's own rules apply.
    """

    def __init__(self, pool, working_slots: Callable[[], Collection[int]] = tuple):
        self.pool = pool
        self.working_slots = working_slots
        self.root = RadixNode((), None, [])
        self._clock = itertools.count(1)

    # ---- lookup -------------------------------------------------------------------------
    def match(self, token_ids: list[int], max_length: int | None = None) -> PrefixMatch:
        """Longest prefix of ``token_ids`` (at most ``max_length`` tokens) ending at a snapshot.

        Marks the path as recently used; does not lock (see :meth:`lock`).
        """
        if not isinstance(token_ids, (list, tuple)):
            raise ValueError(f"token_ids must be a list of ints; got {type(token_ids).__name__}")
        if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool)
                                       or max_length < 0):
            raise ValueError(f"max_length must be None or an int >= 0; got {max_length!r}")
        limit = len(token_ids) if max_length is None else min(max_length, len(token_ids))
        node, depth, best, best_depth = self.root, 0, self.root, 0
        path = []
        while depth < limit:
            child = node.children.get(token_ids[depth])
            if child is None or depth + len(child.tokens) > limit:
                break
            if tuple(token_ids[depth:depth + len(child.tokens)]) != child.tokens:
                break
            node, depth = child, depth + len(child.tokens)
            path.append(node)
            if node.slot is not None:
                best, best_depth = node, depth
        now = next(self._clock)
        for n in path:
            n.last_used = now
        if best is self.root:
            return PrefixMatch(0, self.root, None, None)
        return PrefixMatch(best_depth, best, best.slot, self._path_kv(best))

    def _path_kv(self, node: RadixNode):
        chain = []
        while node.parent is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        n_layers = len(chain[0].kv)
        return [(torch.cat([n.kv[i][0] for n in chain]), torch.cat([n.kv[i][1] for n in chain]))
                for i in range(n_layers)]

    def lock(self, node: RadixNode) -> None:
        """Protect ``node``'s snapshot from eviction while a request uses it."""
        if not isinstance(node, RadixNode):
            raise ValueError(f"node must be a RadixNode (a PrefixMatch's node); got {type(node).__name__}")
        if node is not self.root:
            node.refcount += 1

    def unlock(self, node: RadixNode) -> None:
        """Undo one :meth:`lock`."""
        if not isinstance(node, RadixNode):
            raise ValueError(f"node must be a RadixNode (a PrefixMatch's node); got {type(node).__name__}")
        if node is self.root:
            return
        if node.refcount <= 0:
            raise ValueError("node is not locked: unlock it once per lock")
        node.refcount -= 1

    # ---- insertion ----------------------------------------------------------------------
    def insert(self, token_ids: list[int], slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Cache the snapshot in ``slot`` as the state after all of ``token_ids``.

        ``kv``: per attention layer ``(k, v)`` for at least ``len(token_ids)`` tokens (extra rows
        are ignored), the same number of layers for every entry. Returns True if the cache took
        ownership of ``slot``; False if that prefix already has a snapshot (the caller keeps, and
        eventually frees, ``slot``).

        ``slot`` must be allocated in the pool, not the scratch slot, not already a cached
        snapshot and not a working slot (``working_slots()``); every argument is checked before
        the tree changes (``ValueError``).
        """
        self._check_insert(token_ids, slot, kv)
        node, depth = self.root, 0
        while depth < len(token_ids):
            child = node.children.get(token_ids[depth])
            if child is None:
                # Compact copies: a slice of the forward's KV would keep its whole batch-wide
                # projection alive (the H200 sweeps ran out of memory that way).
                leaf_kv = [(k.clone(), v.clone()) for k, v in self._slice_kv(kv, depth, len(token_ids))]
                leaf = RadixNode(tuple(token_ids[depth:]), node, leaf_kv)
                node.children[token_ids[depth]] = leaf
                node = leaf
                break
            common = 0
            limit = min(len(child.tokens), len(token_ids) - depth)
            while common < limit and child.tokens[common] == token_ids[depth + common]:
                common += 1
            if common < len(child.tokens):
                child = self._split(child, common)
            node, depth = child, depth + len(child.tokens)
        node.last_used = next(self._clock)
        if node.slot is not None:
            return False
        node.slot = slot
        return True

    def _check_insert(self, token_ids, slot, kv) -> None:
        if (not isinstance(token_ids, (list, tuple)) or not token_ids
                or any(type(t) is not int or t < 0 for t in token_ids)):
            raise ValueError("token_ids must be a non-empty list of ints >= 0 (not bools)")
        if type(slot) is not int:
            raise ValueError(f"slot must be an int slot of the pool; got {slot!r}")
        if slot == SCRATCH_SLOT:
            raise ValueError(f"slot must not be the scratch slot {SCRATCH_SLOT} (every forward may write it)")
        if not self.pool.is_allocated(slot):
            raise ValueError(f"slot must be allocated in the pool (pool.alloc); slot {slot} is free")
        if slot in self.snapshot_slots():
            raise ValueError(f"slot {slot} is already owned by the cache (another entry's snapshot); "
                             f"insert a slot that holds this prefix's own snapshot")
        if slot in self.working_slots():
            raise ValueError(f"slot must not be a working slot (every forward of its request writes it, "
                             f"so the snapshot would change); slot {slot} is one: insert a track slot "
                             f"that holds the state after these tokens")
        if not isinstance(kv, (list, tuple)):
            raise ValueError(f"kv must be a list of per-attention-layer (k, v); got {type(kv).__name__}")
        layers = self._kv_layers()
        if layers is not None and len(kv) != layers:
            raise ValueError(f"kv must have one (k, v) per attention layer ({layers}, as the cached "
                             f"entries have); got {len(kv)}")
        for i, pair in enumerate(kv):
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in pair)):
                raise ValueError(f"kv[{i}] must be a pair (k, v) of tensors [tokens, ...]")
            for name, t in zip("kv", pair):
                if t.shape[0] < len(token_ids):
                    raise ValueError(f"kv[{i}] {name} must cover the {len(token_ids)} tokens; "
                                     f"got {t.shape[0]} rows")

    def _kv_layers(self) -> int | None:
        """Attention layers of the cached entries' KV (None while the cache is empty)."""
        for child in self.root.children.values():
            return len(child.kv)
        return None

    @staticmethod
    def _slice_kv(kv, start: int, stop: int):
        return [(k[start:stop], v[start:stop]) for k, v in kv]

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node``'s edge after ``at`` tokens; returns the new upper node (no snapshot)."""
        upper = RadixNode(node.tokens[:at], node.parent, self._slice_kv(node.kv, 0, at),
                          last_used=node.last_used)
        upper.parent.children[upper.tokens[0]] = upper
        node.tokens, node.kv, node.parent = node.tokens[at:], self._slice_kv(node.kv, at, None), upper
        upper.children[node.tokens[0]] = node
        return upper

    # ---- eviction -----------------------------------------------------------------------
    def _leaves(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                yield node

    def evictable_slots(self) -> int:
        """How many snapshot slots :meth:`evict` could free (all unlocked snapshots whose
        subtree holds no locked node)."""
        def count(node) -> tuple[int, bool]:
            total, locked = 0, node.refcount > 0
            for child in node.children.values():
                n, child_locked = count(child)
                total, locked = total + n, locked or child_locked
            if not locked and node.slot is not None:
                total += 1
            return total, locked
        return count(self.root)[0]

    def evict(self, n_slots: int) -> int:
        """Free at least ``n_slots`` snapshot slots, least recently used leaves first.

        Returns the number freed (fewer if not enough are evictable). Locked nodes stay.
        """
        if not isinstance(n_slots, int) or isinstance(n_slots, bool) or n_slots < 0:
            raise ValueError(f"n_slots must be an int >= 0; got {n_slots!r}")
        freed = 0
        while freed < n_slots:
            candidates = [leaf for leaf in self._leaves() if leaf.refcount == 0]
            if not candidates:
                break
            leaf = min(candidates, key=lambda n: n.last_used)
            if leaf.slot is not None:
                self.pool.free([leaf.slot])
                freed += 1
            del leaf.parent.children[leaf.tokens[0]]
        return freed

    def snapshot_slots(self) -> set[int]:
        """All slots the cache owns."""
        out, stack = set(), [self.root]
        while stack:
            node = stack.pop()
            if node.slot is not None:
                out.add(node.slot)
            stack.extend(node.children.values())
        return out
