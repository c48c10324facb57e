"""``autotm``: AutoTM's ILP tensor placement (Hildebrand et al., ASPLOS'20) on unified-memory blocks (offline).

AutoTM profiles a static graph's kernels and solves an integer linear program that decides, for every
tensor and every kernel, where the tensor lives (fast or slow memory) and when it moves, minimising the
modelled run time subject to the fast memory's capacity. Reproduced, per distinct training iteration of
the trace (the plan is periodic: an iteration's last use of a block wraps to its first use in the next):

- **Variables**: one binary ``x_g`` per *gap* of a block (from a use to its next use; see
  ``_swapplan.gaps``): 1 = the block is moved out after the first use and back before the next.
- **Capacity**: at every launch, the blocks the iteration keeps on the GPU (all its blocks, minus the gaps
  swapped over that launch) fit the capacity; a gap frees its room from the launch after its use to its
  swap-in trigger (a fixed lead of ``lead_blocks`` block copy times before the next use, on the
  trace's durations). A slack per launch, priced far above any move, keeps the program feasible when
  the launch's own blocks do not fit (the driver then pages).
- **Objective**: modelled time of the moves: each live swapped gap costs its copy time (the link volume)
  plus the part of its swap-in the lead does not hide; a gap over which the block is dead (freed) costs
  nothing but a tie-breaking epsilon.
- Solved with ``scipy.optimize.milp`` (HiGHS), time-limited by ``time_limit_s`` for the whole trace
  (spread over its distinct iterations); the best solution found is used, and if HiGHS has none in time
  the plan falls back to the free-time greedy order (reported as ``fallback``). ``planning_s`` in the
  report is the whole planning time.

Not reproduced:

- AutoTM's kernel-time model per operand placement (a kernel reading PMM is slower): on a GPU under
  unified memory a kernel's operands must be resident (the simulator's ``PREFER_HOST`` remote reads are
  not used), so placement is only "when resident".
- Its link-contention constraints: copies are costed independently; the FIFO link's queueing is left to
  the run (prefetches are cut to the room the plan's evictions leave, the rest wait, soonest need first).
- Tensors: the unit is the 2 MiB block of the caching-allocator layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ._swapplan import Gaps, OfflineSwapPolicy, Plan, Profile, build_plan, check_common, occupancy, swap_intervals
from .base import Params


@dataclass(frozen=True)
class AutoTMParams(Params):
    time_limit_s: float = 15.0  # HiGHS time for the whole trace (spread over its distinct iterations)
    mip_gap: float = 0.01  # relative optimality gap at which HiGHS stops
    lead_blocks: float = 8.0  # swap-in lead in block copy times, plus lead_s
    lead_s: float = 0.0
    headroom: int = 0  # blocks of capacity kept free
    profile_iter: int = 0  # unused (offline); kept for the shared hooks
    reprofile: str = "never"

    def __post_init__(self) -> None:
        check_common("autotm", self)
        if not self.time_limit_s > 0:
            raise ConfigError(f"autotm: time_limit_s must be > 0, got {self.time_limit_s!r}")
        if not 0 <= self.mip_gap < 1:
            raise ConfigError(f"autotm: mip_gap must be in [0, 1), got {self.mip_gap!r}")


class AutoTMPolicy(OfflineSwapPolicy):
    """AutoTM: an integer linear program over swap decisions per block gap, capacity per launch (offline)."""

    name: ClassVar[str] = "autotm"
    Params: ClassVar[type] = AutoTMParams
    description: ClassVar[str] = "AutoTM (ASPLOS'20), offline: ILP (HiGHS) over block swaps under the capacity"

    def _plan_offline(self, prof: Profile, g: Gaps, budget_s: float) -> Plan:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_matrix

        p = self.params
        P = prof.P
        t_start, allb, nb, cap, stats, done = self._plan_start(prof, g, variables=0, nonzeros=0, status="fits",
                                                               fallback=False, objective=None)
        if done is not None:
            return done
        chosen = np.zeros(g.blk.shape[0], dtype=bool)
        dead, s, cost, r, ok = swap_intervals(g, self.t_blk, p.lead_s, p.lead_blocks)
        idx = np.flatnonzero(ok & (r > s))
        n = idx.shape[0]
        # Occupancy relief as a flow over the unwrapped positions 0..2P-1 (nonzeros ~ 2 per gap, not its
        # length): z_t = z_{t-1} + sum_{s_g = t} x_g - sum_{r_g = t} x_g, and the relief at launch t is
        # z_t + z_{t+P}; it must reach nb - capacity (minus a slack priced far above any move).
        # Columns: x (n), z (2P), slack (P). Rows: 2P flow equalities, then P capacity rows.
        T = 2 * P
        si, ri = s[idx], r[idx]
        xr = np.concatenate([si, ri])
        xc = np.concatenate([np.arange(n), np.arange(n)])
        xv = np.concatenate([-np.ones(n), np.ones(n)])
        zt = np.arange(T)
        fr = np.concatenate([xr, zt, zt[1:]])
        fc = np.concatenate([xc, n + zt, n + zt[:-1]])
        fv = np.concatenate([xv, np.ones(T), -np.ones(T - 1)])
        cr = np.concatenate([T + np.arange(P), T + np.arange(P), T + np.arange(P)])
        cc = np.concatenate([n + np.arange(P), n + P + np.arange(P), n + T + np.arange(P)])
        A = csr_matrix((np.concatenate([fv, np.ones(3 * P)]), (np.concatenate([fr, cr]), np.concatenate([fc, cc]))),
                       shape=(T + P, n + T + P))
        hidden = g.t0[g.q[idx]] - g.t0[r[idx]]
        c_move = np.where(dead[idx], 1e-9, self.t_blk + np.maximum(0.0, self.t_blk - hidden))
        c = np.concatenate([c_move, np.zeros(T), np.full(P, 1e3 * self.t_blk)])
        need = float(nb - cap)
        lb = np.concatenate([np.zeros(T), np.full(P, need)])
        ub = np.concatenate([np.zeros(T), np.full(P, np.inf)])
        integrality = np.concatenate([np.ones(n), np.zeros(T + P)])
        res = milp(c, constraints=LinearConstraint(A, lb=lb, ub=ub), integrality=integrality,
                   bounds=Bounds(0, np.concatenate([np.ones(n), np.full(T, np.inf), np.full(P, need)])),
                   options={"time_limit": max(0.5, budget_s), "mip_rel_gap": p.mip_gap})
        stats.update(variables=int(n + T + P), nonzeros=int(A.nnz), status=str(res.message)[:80])
        if res.x is not None:
            chosen[idx[res.x[:n] > 0.5]] = True
            stats["objective"] = float(res.fun)
            stats["slack_blocks"] = float(res.x[n + T:].sum())
        else:  # no integer solution in time: the free-time greedy order
            stats["fallback"] = True
            occ = np.full(P, nb, dtype=np.int64)
            for gi in idx[np.argsort(-(g.gap_s[idx]), kind="stable")].tolist():
                seg = np.arange(s[gi], r[gi]) % P
                if occ[seg].max() > cap:
                    occ[seg] -= 1
                    chosen[gi] = True
        stats["peak_occupancy_after"] = int(occupancy(P, nb, s[chosen], r[chosen]).max())
        return build_plan(P, g, s, r, chosen, allb, stats, t_start)
