"""``swapadvisor``: SwapAdvisor's genetic search over swap decisions (Huang et al., ASPLOS'20) (offline).

SwapAdvisor plans swapping for a static dataflow graph before training: a genetic algorithm searches
(operator schedule, memory allocation) genomes, each decoded into swap-out / swap-in decisions and scored
by a simulator of the GPU's compute and copy streams; the best plan runs. Reproduced, per distinct
training iteration of the trace (plans are periodic, as for ``autotm``):

- **Genome**: one bit per *gap* of a block (``_swapplan.gaps``: a use and the block's next use); 1 = the
  block is swapped out after the use and back in a fixed lead (``lead_blocks`` block copy times, on the
  trace's durations) before the next use.
- **Fitness** (lower is better), vectorised per genome: the modelled delay of the iteration, i.e. the
  latest lateness of a swap-in on a FIFO host-to-device link fed at its triggers (finish of copy ``j`` =
  ``C_j + max_{k<=j}(issue_k - C_{k-1})``), plus, for every launch where the modelled occupancy exceeds
  the capacity, two block copy times per newly excess block (the driver would evict and fault it back),
  plus ``volume_weight`` x the link time of all swaps (write-backs and copies that the latest-lateness
  term does not see).
- **Search**: a population of ``population`` genomes seeded with the free-time greedy plan (the one
  ``capuchin`` uses) and mutations of it; tournament selection, crossover by launch range (the child
  takes one parent's bits for the gaps that open in a random range of launches, the other's elsewhere),
  bit-flip mutation, two elites kept; it stops after ``generations`` or ``time_limit_s`` for the whole
  trace (spread over its distinct iterations). Deterministic for a ``seed``. ``planning_s`` and the
  best fitness found against the seed's are in the report.

Not reproduced:

- The operator-schedule half of the genome (the trace's launch order is the schedule) and the memory-
  allocation half (SwapAdvisor chooses tensor addresses to control fragmentation; here the caching
  allocator's layout is fixed by the trace): only the swap decisions are searched.
- SwapAdvisor's own simulator: the fitness is the coarse link model above, and the plan then runs on this
  project's simulator (prefetches cut to the room the plan's evictions leave, the rest wait).
- Tensors: the unit is the 2 MiB block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ._swapplan import Gaps, OfflineSwapPolicy, Plan, Profile, build_plan, check_common, occupancy, swap_intervals
from .base import Params


@dataclass(frozen=True)
class SwapAdvisorParams(Params):
    population: int = 24
    generations: int = 200
    time_limit_s: float = 10.0  # search time for the whole trace (spread over its distinct iterations)
    mutation: float = 0.002  # per-bit flip probability
    volume_weight: float = 1.0  # fitness += this x the link time of all swaps (their write-backs and copies)
    seed: int = 0
    lead_blocks: float = 8.0  # swap-in lead in block copy times, plus lead_s
    lead_s: float = 0.0
    headroom: int = 0
    profile_iter: int = 0  # unused (offline); kept for the shared hooks
    reprofile: str = "never"

    def __post_init__(self) -> None:
        check_common("swapadvisor", self)
        self.check_ints("swapadvisor", ("population", "generations"), least=2)
        if not self.time_limit_s > 0:
            raise ConfigError(f"swapadvisor: time_limit_s must be > 0, got {self.time_limit_s!r}")
        if not self.volume_weight >= 0:
            raise ConfigError(f"swapadvisor: volume_weight must be >= 0, got {self.volume_weight!r}")
        if not 0 <= self.mutation <= 1:
            raise ConfigError(f"swapadvisor: mutation must be in [0, 1], got {self.mutation!r}")


class SwapAdvisorPolicy(OfflineSwapPolicy):
    """SwapAdvisor: genetic search over per-gap swap bits, scored by a link/capacity model (offline)."""

    name: ClassVar[str] = "swapadvisor"
    Params: ClassVar[type] = SwapAdvisorParams
    description: ClassVar[str] = "SwapAdvisor (ASPLOS'20), offline: genetic search over block swaps, link-model fitness"

    def _plan_offline(self, prof: Profile, g: Gaps, budget_s: float) -> Plan:
        p = self.params
        P = prof.P
        t_start, allb, nb, cap, stats, done = self._plan_start(prof, g, generations=0, evaluations=0,
                                                               seed_fitness=None, best_fitness=None)
        if done is not None:
            return done
        m = g.blk.shape[0]
        tb = self.t_blk
        dead, s, cost, r, ok = swap_intervals(g, tb, p.lead_s, p.lead_blocks)
        idx = np.flatnonzero(ok & (r > s))
        n = idx.shape[0]
        si, ri, ci, dd = s[idx], r[idx], cost[idx], dead[idx]
        issue = g.t0[ri]
        need = g.t0[g.q[idx]]
        order = np.argsort(issue, kind="stable")  # FIFO order of swap-ins
        o_issue, o_need, o_cost = issue[order], need[order], ci[order]

        def fitness(x: np.ndarray) -> float:
            sel = x[order]
            c = o_cost[sel]
            if c.size:
                cum = np.cumsum(c)
                finish = cum + np.maximum.accumulate(o_issue[sel] - (cum - c))
                delay = max(0.0, float((finish - o_need[sel]).max()))
            else:
                delay = 0.0
            occ = occupancy(P, nb, si[x], ri[x])
            ex = np.maximum(occ - cap, 0)
            new = float(np.maximum(np.diff(np.r_[ex[-1], ex]), 0).sum())
            return delay + 2.0 * tb * new + p.volume_weight * float(ci[x].sum())

        # Seed: the free-time greedy fill (dead gaps, then the largest gap first, until every launch fits).
        seed = np.zeros(n, dtype=bool)
        occ = np.full(P, nb, dtype=np.int64)
        for k in np.argsort(-(g.gap_s[idx] + np.where(dd, 1e9, 0.0)), kind="stable").tolist():
            seg = np.arange(si[k], ri[k]) % P
            if occ[seg].max() > cap:
                occ[seg] -= 1
                seed[k] = True
        rng = np.random.default_rng(p.seed)
        N = p.population
        pop = np.repeat(seed[None, :], N, axis=0)
        pop[1:] ^= rng.random((N - 1, n)) < max(p.mutation, 1.0 / max(n, 1))
        fit = np.array([fitness(x) for x in pop])
        stats["seed_fitness"] = float(fit[0])
        evals = N
        gen = 0
        deadline = t_start + budget_s
        s_of = si % P
        while gen < p.generations and time.perf_counter() < deadline:
            gen += 1
            elite = np.argsort(fit)[:2]
            children = [pop[elite[0]].copy(), pop[elite[1]].copy()]
            while len(children) < N:
                a, b = (min(rng.choice(N, 2, replace=False), key=lambda i: fit[i]) for _ in range(2))
                lo, hi = np.sort(rng.integers(0, P + 1, 2))
                take = (s_of >= lo) & (s_of < hi)
                child = np.where(take, pop[a], pop[b])
                child ^= rng.random(n) < p.mutation
                children.append(child)
            pop = np.array(children)
            fit = np.concatenate([fit[elite], [fitness(x) for x in pop[2:]]])
            evals += N - 2
        best = pop[int(np.argmin(fit))]
        stats.update(generations=gen, evaluations=evals, best_fitness=float(fit.min()),
                     peak_occupancy_after=int(occupancy(P, nb, si[best], ri[best]).max()))
        chosen = np.zeros(m, dtype=bool)
        chosen[idx[best]] = True
        return build_plan(P, g, s, r, chosen, allb, stats, t_start)
