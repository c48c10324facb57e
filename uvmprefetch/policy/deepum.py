"""``deepum``: a faithful reproduction of DeepUM's prefetcher (Jung et al., ASPLOS'23, §4-5): our baseline.

Reproduced:

- **Execution ids**: DeepUM hashes the kernel name with its *argument values*, which include the tensor
  pointers, so layer 3's GEMM and layer 4's GEMM are different ids. The trace's ``info.exec_id`` hashes
  name + argument *shapes* only (identical layers collide), and the hooks do not carry argument pointers;
  reading them off ``info.blocks`` would leak access knowledge DeepUM learns from faults. So by default
  (``exec_key="occurrence"``) the id is (``info.exec_id``, how many times that id already ran in this
  iteration): the same launch of the same layer gets the same id every step, as with DeepUM's argument
  hash under a deterministic caching allocator. ``exec_key="shape"`` uses ``info.exec_id`` as is.
- **Execution-id correlation table**: (3 preceding exec ids) -> next exec id, bounded LRU.
- **UM-block correlation tables**, one per execution id, learned **only from faults** (``on_fault``; the
  per-launch access list ``info.blocks`` is never read): a set-associative table of ``rows`` (2048) rows x
  ``ways`` (2) ways keyed by block; each entry keeps up to ``successors`` (4) successor blocks, most recent
  first; plus the kernel's *start* block (first fault of its first execution) and *end* block (last fault).
  Consecutive faults of one execution ``a, b`` record ``b`` as a successor of ``a``.
- **Chained prefetch**: at each launch the exec-id table predicts the next ``n_kernels`` (32) kernels; for
  the running kernel and each predicted one, the block chain is walked from the start block through the
  successors (all of them, depth-first) to the end block, and the blocks not on the GPU are prefetched in
  kernel order.
- **Pre-eviction**: resident blocks not in the chains of the current or next N kernels are evicted to
  make room for the prefetches (freed blocks first, then least recently brought in).
- **Invalidation**: blocks freed by PyTorch are dead (``on_free``): dropped without write-back. DeepUM's
  allocator hook also tells the driver when the caching allocator hands a freed block out again; here that
  news arrives with the first launch that uses the block (``info.blocks`` is read for this alone, never for
  prediction): the block is live again and must not be dropped. Before this was modelled, deepum discarded
  blocks holding live tensors (27 220 at GPT-2 large 1.5x), which the simulator charged as free evictions
  and which on a GPU would lose data; the simulator now evicts such blocks instead (``refused_discards``).

Not reproduced / simplified:

- DeepUM runs in a driver module with its own fault-handling threads; here prefetches are issued at
  launch time through the same ``Decision`` as every policy, and the fault order within one launch is
  taken as ascending block order (the simulator reports a launch's faults as one set).
- Prefetches are cut at the room that free memory plus pre-evictable blocks give (DeepUM's prefetch
  thread likewise never evicts blocks of the next N kernels for a prefetch); the rest fault.
- Chain walks are cached per execution id and invalidated when its table learns something new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from .base import EMPTY, Decision, EvictPath, LaunchInfo, Params, Policy, PolicyContext, ResidencyView
from .tables import LruMap, SetAssocTable


@dataclass(frozen=True)
class DeepUMParams(Params):
    n_kernels: int = 32  # chained prefetch depth (the paper's best N)
    rows: int = 2048  # UM-block correlation table rows
    ways: int = 2
    successors: int = 4
    history: int = 3  # predecessors in the exec-id correlation context
    exec_entries: int = 1 << 16  # bound of the exec-id correlation table
    max_tables: int = 8192  # bound on per-exec-id block tables (LRU)
    prefetch: bool = True
    pre_evict: bool = True
    invalidate: bool = True
    exec_key: str = "occurrence"  # "occurrence" (exec id + occurrence in the iteration) or "shape" (exec id)
    cut_to_room: bool = True  # prefetch only what free + pre-evictable room holds (False: the driver evicts)

    def __post_init__(self) -> None:
        self.check_ints("deepum", ("n_kernels", "rows", "ways", "successors", "history", "exec_entries", "max_tables"))
        if self.exec_key not in ("occurrence", "shape"):
            raise ConfigError(f"deepum: exec_key must be 'occurrence' or 'shape', got {self.exec_key!r}")


class _BlockTable:
    """One execution id's UM-block correlation table."""

    __slots__ = ("tab", "start", "end", "chain")

    def __init__(self, rows: int, ways: int) -> None:
        self.tab = SetAssocTable(rows, ways)
        self.start = -1
        self.end = -1
        self.chain: np.ndarray | None = None  # cached walk


class DeepUMPolicy(Policy):
    """DeepUM: exec-id correlation + per-kernel fault-learned block chains, N-kernel chained prefetch."""

    name: ClassVar[str] = "deepum"
    Params: ClassVar[type] = DeepUMParams
    description: ClassVar[str] = "DeepUM (ASPLOS'23): fault-learned correlation tables, chained prefetch, pre-eviction"
    evict_path: ClassVar[EvictPath] = EvictPath.UVM  # a driver module: its pre-evictions are the driver's migrations

    def __init__(self, params: DeepUMParams | None = None, **overrides) -> None:
        super().__init__(params, **overrides)
        self.invalidates_frees = bool(self.params.invalidate)

    def on_start(self, ctx: PolicyContext) -> None:
        super().on_start(ctx)
        P = self.params
        self.exec_tab = LruMap(P.exec_entries)
        self.tables = LruMap(P.max_tables)
        self.recent: list[int] = []
        self.dead = np.zeros(ctx.max_blocks, dtype=bool)
        self.brought = np.zeros(ctx.max_blocks, dtype=np.int64)  # sequence number of the last prefetch/fault
        self.seq = 0
        self.occ: dict[int, int] = {}  # exec id -> launches this iteration (exec_key="occurrence")
        self.stats = dict(launches=0, predicted_kernels=0, prefetched_blocks=0, evicted_blocks=0, learned_faults=0)

    # ------------------------------------------------------------------------------------------ hooks
    def on_free(self, blocks: np.ndarray) -> None:
        if self.params.invalidate:
            self.dead[blocks] = True

    def on_iteration(self, k: int) -> None:
        self.occ.clear()

    def _eid(self, info: LaunchInfo, count: bool = False) -> int:
        e = int(info.exec_id)
        if self.params.exec_key == "shape":
            return e
        n = self.occ.get(e, 0)
        if count:
            self.occ[e] = n + 1
            return hash((e, n))
        return hash((e, n - 1))  # on_fault: the launch already counted

    def on_fault(self, info: LaunchInfo, blocks: np.ndarray) -> None:
        self.seq += 1
        self.brought[blocks] = self.seq
        self.dead[blocks] = False
        if not blocks.size:
            return
        P = self.params
        eid = self._eid(info)
        t = self.tables.get(eid)
        if t is None:
            t = _BlockTable(P.rows, P.ways)
            self.tables.put(eid, t)
        seq = blocks.tolist()  # faults arrive as one set per launch; ascending order stands for fault order
        if t.start < 0:
            t.start = seq[0]
        t.end = seq[-1]
        for a, b in zip(seq, seq[1:]):
            succ = t.tab.get(a)
            if succ is None:
                t.tab.put(a, [b])
            elif not succ or succ[0] != b:
                if b in succ:
                    succ.remove(b)
                succ.insert(0, b)
                del succ[P.successors:]
        if t.tab.get(seq[-1]) is None:
            t.tab.put(seq[-1], [])
        t.chain = None
        self.stats["learned_faults"] += len(seq)

    def on_launch(self, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        P = self.params
        self.stats["launches"] += 1
        if info.known_accesses and info.blocks.size:
            self.dead[info.blocks] = False  # handed out again by the allocator (see the module docstring)
        e = self._eid(info, count=True)
        h = P.history
        if len(self.recent) >= h:
            self.exec_tab.put(tuple(self.recent[-h:]), e)
        self.recent.append(e)
        if len(self.recent) > h:
            del self.recent[0]
        if not P.prefetch:
            return None
        chains = [self._chain(e)]
        ctxt = list(self.recent)
        for _ in range(P.n_kernels):
            if len(ctxt) < h:
                break
            nxt = self.exec_tab.get(tuple(ctxt[-h:]))
            if nxt is None:
                break
            self.stats["predicted_kernels"] += 1
            chains.append(self._chain(nxt))
            ctxt.append(nxt)
        chains = [c for c in chains if c.size]
        if not chains:
            return None
        need = np.concatenate(chains)
        _, first = np.unique(need, return_index=True)
        need = need[np.sort(first)]
        present = state.resident | state.in_flight
        pf = need[~present[need]]
        if not pf.size:
            return None
        free = max(0, state.capacity_blocks - state.used_blocks)
        evict = discard = EMPTY
        if pf.shape[0] > free:
            if P.pre_evict:
                needed = np.zeros(state.resident.shape[0], dtype=bool)
                needed[need] = True
                cand = np.flatnonzero(state.resident & ~needed)
                k = min(cand.shape[0], pf.shape[0] - free)
                if k:
                    # Freed (dead) blocks first, then the least recently brought in.
                    order = np.lexsort((self.brought[cand], ~self.dead[cand]))[:k]
                    victims = cand[order]
                    d = self.dead[victims]
                    discard, evict = victims[d], victims[~d]
                    self.stats["evicted_blocks"] += k
                if P.cut_to_room:
                    pf = pf[:free + k]
            elif P.cut_to_room:
                pf = pf[:free] if free else EMPTY  # no pre-eviction: only what fits
        if pf.size:
            self.seq += 1
            self.brought[pf] = self.seq
            self.stats["prefetched_blocks"] += pf.shape[0]
        if not (pf.size or evict.size or discard.size):
            return None
        return Decision(prefetch=pf, evict=evict, discard=discard)

    def report(self) -> dict:
        out = dict(self.stats)
        n_entries = sum(len(t.tab) for _, t in self.tables.items())
        out["exec_table_entries"] = len(self.exec_tab)
        out["block_tables"] = len(self.tables)
        out["block_table_entries"] = n_entries
        out["state_bytes"] = int(self.exec_tab.nbytes + n_entries * 100 + self.dead.nbytes + self.brought.nbytes)
        return out

    # ------------------------------------------------------------------------------------ internals
    def _chain(self, e: int) -> np.ndarray:
        """Blocks of kernel ``e``'s chain: depth-first from the start block through successors to the end."""
        t = self.tables.get(e)
        if t is None or t.start < 0:
            return EMPTY
        if t.chain is not None:
            return t.chain
        out, seen = [], set()
        stack = [t.start]
        limit = self.params.rows * self.params.ways
        while stack and len(out) < limit:
            b = stack.pop()
            if b in seen:
                continue
            seen.add(b)
            out.append(b)
            if b == t.end:
                continue
            succ = t.tab.get(b)
            if succ:
                stack.extend(reversed(succ))  # most recent successor is walked first
        t.chain = np.asarray(out, dtype=np.int64)
        return t.chain
