"""A radix tree over token ids whose nodes hold recurrent-state snapshots (and attention KV).

A recurrent state cannot be rewound, so a cached prefix is usable only up to a node that holds
a **snapshot slot**: the (conv, SSM) states of every GDN layer after exactly that many tokens.
Nodes without one (left behind when an edge is split) are only paths to deeper snapshots.

Every node also keeps the attention layers' KV of its edge tokens (``kv[layer] = (k, v)``,
``[edge_len, kv_heads, head_dim]`` each), so a hit hands the attention layers their prefix.
Snapshots in use are locked (reference counts); eviction frees least-recently-used unlocked
leaves and returns their slots to the pool.

Ownership: a snapshot slot belongs to the cache (its owner in the :class:`StatePool`); it takes
a slot only from the owner that :meth:`RadixCache.insert` is told, and each lock is held by the
owner that took it (:meth:`RadixCache.lock`), so another party can neither unlock it nor lock a
node of another cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch

from mamba_edu.serving.pool import SCRATCH_SLOT, StatePool, not_to
from mamba_edu.serving.tokens import Tokens


@dataclass(eq=False)
class RadixNode:
    """One edge of the tree: the tokens from the parent's end to this node's end."""

    tokens: tuple[int, ...]
    parent: RadixNode | None
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    slot: int | None = None
    last_used: int = 0
    children: dict[int, RadixNode] = field(default_factory=dict)
    holders: list = field(default_factory=list, repr=False)  # one entry per lock: who took it

    def __repr__(self) -> str:  # flat: a deep tree must not recurse through parent and children
        head = self.tokens[:4]
        more = f", … {len(self.tokens)} tokens" if len(self.tokens) > 4 else ""
        return (f"RadixNode(tokens={head}{more}, depth={self.depth}, slot={self.slot}, "
                f"children={len(self.children)}, locks={self.refcount})")

    @property
    def refcount(self) -> int:
        """Number of locks held on this node."""
        return len(self.holders)

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
    path: tuple = field(default=(), repr=False)  # the nodes walked, for RadixCache.touch


class _CacheKey:
    """What the pool records as the owner of the cache's snapshots: a key only the cache holds,
    so that no caller can pass as the cache by handing over the cache object."""

    def __repr__(self) -> str:
        return "the prefix cache"


class RadixCache:
    """Prefix cache. ``pool`` is the :class:`StatePool` whose slots the snapshots occupy.

    ``working_slots``: called by :meth:`insert`, returns the slots that forwards write now (an
    engine's running requests' and prepared batches' working slots); none of them may become a
    snapshot. Without it, only the pool's own rules apply. ``kv_layers``: the model's number of
    attention layers, which every entry's ``kv`` must have; ``kv_row``: ``(shape, dtype, device)``
    of one token's k (and v), e.g. ``((kv_heads, head_dim), torch.bfloat16, device)`` (None: the
    first entry's count and rows, which the later ones must match).
    """

    def __init__(self, pool, working_slots: Callable[[], Collection[int]] = tuple,
                 kv_layers: int | None = None, kv_row: tuple | None = None):
        if not isinstance(pool, StatePool) or not callable(working_slots):
            raise TypeError(f"RadixCache needs a StatePool and a callable working_slots; got "
                            f"{type(pool).__name__} and {type(working_slots).__name__}")
        if kv_layers is not None and (type(kv_layers) is not int or kv_layers < 0):
            raise ValueError(f"kv_layers must be an int >= 0 (the model's attention layers); got {kv_layers!r}")
        if kv_row is not None and not (isinstance(kv_row, tuple) and len(kv_row) == 3
                                       and isinstance(kv_row[1], torch.dtype)):
            raise ValueError(f"kv_row must be (shape, dtype, device) of one token's k; got {kv_row!r}")
        self.kv_row = None if kv_row is None else (tuple(kv_row[0]), kv_row[1], torch.device(kv_row[2]))
        self.pool = pool
        self.working_slots = working_slots
        self.kv_layers = kv_layers
        self.root = RadixNode((), None, [])
        self._clock = itertools.count(1)
        self._key = _CacheKey()  # the pool's owner of every snapshot slot

    @classmethod
    def for_model(cls, pool, config, dtype: torch.dtype, device, working_slots=tuple) -> RadixCache:
        """The cache of a model of ``config`` (a :class:`~mamba_edu.model.ModelConfig`) whose k and v
        are ``dtype`` on ``device``: its entries must have one ``(k, v)`` per attention layer, each
        ``[tokens, kv_heads, head_dim]``."""
        row = ((config.attn_kv_heads, config.attn_head_dim), dtype, device)
        return cls(pool, working_slots, len(config.attn_layers), row)

    # ---- lookup -------------------------------------------------------------------------
    def match(self, token_ids: list[int], max_length: int | None = None, touch: bool = True) -> PrefixMatch:
        """Longest prefix of ``token_ids`` (at most ``max_length`` tokens) ending at a snapshot.

        Marks the path as recently used (unless ``touch`` is False: then :meth:`touch` does it
        later); does not lock (see :meth:`lock`).
        """
        token_ids = Tokens.of(token_ids)  # an engine's request holds Tokens: no second pass
        if type(touch) is not bool:
            raise ValueError(f"touch must be True or False; got {touch!r}")
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
        if best is self.root:
            match = PrefixMatch(0, self.root, None, None, tuple(path))
        else:
            match = PrefixMatch(best_depth, best, best.slot, self._path_kv(best), tuple(path))
        if touch:
            self.touch(match)
        return match

    def touch(self, match: PrefixMatch) -> None:
        """Mark the path ``match`` (of this cache's :meth:`match`) walked as recently used."""
        if not isinstance(match, PrefixMatch):
            raise ValueError(f"match must be a PrefixMatch (this cache's match()); got {type(match).__name__}")
        self._check_node(match.node)
        now = next(self._clock)
        for n in match.path:
            n.last_used = now

    def _path_kv(self, node: RadixNode):
        chain = []
        while node.parent is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        n_layers = len(chain[0].kv)
        return [(torch.cat([n.kv[i][0] for n in chain]), torch.cat([n.kv[i][1] for n in chain]))
                for i in range(n_layers)]

    def _check_node(self, node) -> None:
        """``node`` must be a node of this cache's tree (not another cache's, not evicted)."""
        if not isinstance(node, RadixNode):
            raise ValueError(f"node must be a RadixNode (a PrefixMatch's node); got {type(node).__name__}")
        n = node
        while n.parent is not None:
            if n.parent.children.get(n.tokens[0] if n.tokens else None) is not n:
                break
            n = n.parent
        if n is not self.root:
            raise ValueError("node is not in this cache's tree (another cache's node, or one that was "
                             "evicted): lock the node of this cache's own match")

    def lock(self, node: RadixNode, owner=None) -> None:
        """Protect ``node``'s snapshot from eviction while ``owner`` uses it (one lock, held by
        ``owner``: only ``owner`` can :meth:`unlock` it)."""
        self._check_node(node)
        if node is not self.root:
            node.holders.append(owner)

    def unlock(self, node: RadixNode, owner=None) -> None:
        """Undo one :meth:`lock` that ``owner`` took."""
        self._check_node(node)
        if node is self.root:
            return
        for i, holder in enumerate(node.holders):
            if holder is owner:
                del node.holders[i]
                return
        if node.holders:
            raise ValueError(f"node is not locked by {owner!r} (its locks are held by another owner, "
                             f"e.g. an Engine's requests): only the owner of a lock unlocks it")
        raise ValueError("node is not locked: unlock it once per lock")

    # ---- insertion ----------------------------------------------------------------------
    def insert(self, token_ids: list[int], slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]],
               owner=None) -> bool:
        """Cache the snapshot in ``slot`` as the state after all of ``token_ids``.

        ``kv``: per attention layer ``(k, v)`` for at least ``len(token_ids)`` tokens (extra rows
        are ignored), the same number of layers, per-token shape, dtype and device for every
        entry. Returns True if the cache took ownership of ``slot`` (from ``owner``, its owner in
        the pool); False if that prefix already has a snapshot (``owner`` keeps, and eventually
        frees, ``slot``).

        ``slot`` must be allocated to ``owner``, not the scratch slot, not already a cached
        snapshot and not a working slot (``working_slots()``); every argument is checked, and the
        new entry's KV copied, before the tree changes (``ValueError``).
        """
        token_ids = self._check_insert(token_ids, slot, kv, owner)
        # Where the new leaf would start: its KV is copied before anything changes.
        node, depth = self.root, 0
        while depth < len(token_ids):
            child = node.children.get(token_ids[depth])
            if child is None:
                break
            common = 0
            limit = min(len(child.tokens), len(token_ids) - depth)
            while common < limit and child.tokens[common] == token_ids[depth + common]:
                common += 1
            node, depth = child, depth + common
            if common < len(child.tokens):
                break
        leaf_kv = None
        if depth < len(token_ids):
            # Compact copies: a slice of the forward's KV would keep its whole batch-wide
            # projection alive (the H200 sweeps ran out of memory that way).
            leaf_kv = [(k.clone(), v.clone()) for k, v in self._slice_kv(kv, depth, len(token_ids))]
        node, depth = self.root, 0
        while depth < len(token_ids):
            child = node.children.get(token_ids[depth])
            if child is None:
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
        self.pool.transfer([slot], owner, self._key)
        node.slot = slot
        return True

    def _check_insert(self, token_ids, slot, kv, owner) -> Tokens:
        token_ids = Tokens.of(token_ids)
        if not token_ids:
            raise ValueError("token_ids must be a non-empty list of ints >= 0")
        if type(slot) is not int:
            raise ValueError(f"slot must be an int slot of the pool; got {slot!r}")
        if slot == SCRATCH_SLOT:
            raise ValueError(f"slot must not be the scratch slot {SCRATCH_SLOT} (every forward may write it)")
        if not self.pool.is_allocated(slot):
            raise ValueError(f"slot must be allocated in the pool (pool.alloc); slot {slot} is free")
        if self.pool.owner_of(slot) is self._key:  # the snapshots' slots (no walk of the tree)
            raise ValueError(f"slot {slot} is already owned by the cache (another entry's snapshot); "
                             f"insert a slot that holds this prefix's own snapshot")
        if slot in self.working_slots():
            raise ValueError(f"slot must not be a working slot (every forward of its request writes it, "
                             f"so the snapshot would change); slot {slot} is one: insert a track slot "
                             f"that holds the state after these tokens")
        if self.pool.owner_of(slot) is not owner:
            raise ValueError(f"slot {slot} belongs to {not_to(self.pool.owner_of(slot), owner)}: only a "
                             f"slot's owner can hand it to the cache")
        if not isinstance(kv, (list, tuple)):
            raise ValueError(f"kv must be a list of per-attention-layer (k, v); got {type(kv).__name__}")
        if self.kv_layers is not None and len(kv) != self.kv_layers:
            raise ValueError(f"kv must have one (k, v) per attention layer of the model ({self.kv_layers}); "
                             f"got {len(kv)}")
        example = self._kv_example()
        if example is not None and len(kv) != len(example):
            raise ValueError(f"kv must have one (k, v) per attention layer ({len(example)}, as the cached "
                             f"entries have); got {len(kv)}")
        for i, pair in enumerate(kv):
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in pair)):
                raise ValueError(f"kv[{i}] must be a pair (k, v) of tensors [tokens, ...]")
            for j, (name, t) in enumerate(zip("kv", pair)):
                if t.shape[0] < len(token_ids):
                    raise ValueError(f"kv[{i}] {name} must cover the {len(token_ids)} tokens; "
                                     f"got {t.shape[0]} rows")
                want = self.kv_row or (example and (tuple(example[i][j].shape[1:]), example[i][j].dtype,
                                                    example[i][j].device))
                if want and ((tuple(t.shape[1:]), t.dtype) != want[:2] or t.device.type != want[2].type
                             or want[2].index not in (None, t.device.index)):  # "cuda" is any cuda:i
                    raise ValueError(f"kv[{i}] {name} must be [tokens, {', '.join(map(str, want[0]))}] "
                                     f"{want[1]} on {want[2]} like the model's (or the cached entries'); got "
                                     f"{list(t.shape)} {t.dtype} on {t.device}")
        return token_ids

    def _kv_example(self) -> list | None:
        """One cached entry's KV, the shape every entry's must have (None while the cache is empty)."""
        for child in self.root.children.values():
            return child.kv
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
    def evictable_slots(self) -> int:
        """How many snapshot slots :meth:`evict` could free (all unlocked snapshots whose
        subtree holds no locked node)."""
        order, stack = [], [self.root]  # parents before children; counted in reverse, no recursion
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        locked_below, total = {}, 0
        for node in reversed(order):
            locked = node.refcount > 0 or any(locked_below[id(c)] for c in node.children.values())
            locked_below[id(node)] = locked
            total += not locked and node.slot is not None
        return total

    def eviction_plan(self, n_slots: int, protect=()) -> list[RadixNode]:
        """The nodes :meth:`evict` would remove (in order) to free ``n_slots`` snapshot slots,
        treating the nodes in ``protect`` as locked; nothing changes."""
        if not isinstance(n_slots, int) or isinstance(n_slots, bool) or n_slots < 0:
            raise ValueError(f"n_slots must be an int >= 0; got {n_slots!r}")
        removed, freed, plan = set(), 0, []
        kept = list(protect)

        def live_children(node):
            return [c for c in node.children.values() if id(c) not in removed]

        while freed < n_slots:
            candidates = []
            stack = [self.root]
            while stack:
                node = stack.pop()
                children = live_children(node)
                if node is not self.root and not children and node.refcount == 0 \
                        and not any(node is p for p in kept):
                    candidates.append(node)
                stack.extend(children)
            if not candidates:
                break
            leaf = min(candidates, key=lambda n: n.last_used)
            plan.append(leaf)
            removed.add(id(leaf))
            freed += leaf.slot is not None
        return plan

    def evict(self, n_slots: int, protect=()) -> int:
        """Free at least ``n_slots`` snapshot slots, least recently used leaves first.

        Returns the number freed (fewer if not enough are evictable). Locked nodes (and those in
        ``protect``) stay.
        """
        plan = self.eviction_plan(n_slots, protect)
        slots = [leaf.slot for leaf in plan if leaf.slot is not None]
        self.pool.free(slots, self._key)
        for leaf in plan:
            del leaf.parent.children[leaf.tokens[0]]
        return len(slots)

    def snapshot_slots(self) -> set[int]:
        """All slots the cache owns."""
        out, stack = set(), [self.root]
        while stack:
            node = stack.pop()
            if node.slot is not None:
                out.add(node.slot)
            stack.extend(node.children.values())
        return out
