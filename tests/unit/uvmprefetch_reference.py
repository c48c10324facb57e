"""A slow, obvious implementation of ``uvmprefetch``'s launch hooks in Python and NumPy: the reference that the
compiled hooks (``policy/uvmprefetch/step.py``) are checked against, decision for decision and state for state.

``ReferencePolicy`` keeps its state in the same parts as the production policy (so the two can be compared after
every hook) but decides as the policy's description reads: a full victim scan at every decision (no victim pool),
the window pass listing and updating every scanned entry (no verified span, no cut list), each step written out.
It uses the production code only for the shared pieces tested on their own: the compiled set-associative table of
``policy/tables.py`` and the two hashes (``launch_sig``, ``stable_sig``); ``on_iteration`` and ``report`` are the
production ones.
"""

from __future__ import annotations

import numpy as np

from uvmprefetch.policy.base import EMPTY, Decision
from uvmprefetch.policy.tables import assoc_count, assoc_get, assoc_put, mix64
from uvmprefetch.policy.uvmprefetch import UvmPrefetchPolicy
from uvmprefetch.policy.uvmprefetch.correlation import launch_sig, stable_sig
from uvmprefetch.policy.uvmprefetch.history import INF
from uvmprefetch.policy.uvmprefetch.victims import AGE, K_CLEAN, K_DEAD, K_DIRTY

MASK63 = (1 << 63) - 1
SEED = 0x5EED


def seq_key(row, last) -> int:
    h = SEED
    for v in row:
        h = int(mix64(h, int(v)))
    return int(mix64(h, int(last)))


def victims_ref(resident: np.ndarray, cur: np.ndarray, state: tuple, p: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``k`` resident blocks not in ``cur`` in eviction order, with their keys (larger = evict first).
    ``state`` is ``(dead, nu, dirty, last_use, dead_reuse, gmask)``: far uses at a grain (``victims._vkey``)."""
    dead_all, nu_all, dirty, last_use, dead_reuse, gmask = state
    mask = resident.copy()
    mask[cur] = False
    res = np.flatnonzero(mask)[::-1]  # (equal keys: the highest block leaves first; the sorts are stable)
    if not res.size:
        return EMPTY, EMPTY
    nu = nu_all[res]
    unpred = (nu >= INF) | (nu <= p)
    dead = dead_all[res] & (unpred | (not dead_reuse))
    nd = int(dead.sum())
    head = res[dead]
    if nd:  # dead blocks first: the farthest (or no) predicted reuse of the address first
        dn = np.where(unpred[dead], INF, nu[dead])
        head = head[np.argsort(-dn, kind="stable")]
    if nd >= k:
        return head[:k], np.full(k, K_DEAD, dtype=np.int64)
    live = res[~dead]
    u = unpred[~dead]
    v = nu[~dead]
    v = np.where(v - p > -2 * gmask, v | ~gmask, v)  # (far uses: to the end of their ``victim_grain``)
    key = np.where(u, np.where(dirty[live], K_DIRTY, K_CLEAN) + (AGE - last_use[live]), v)
    order = np.argsort(-key, kind="stable")[:k - nd]
    return (np.concatenate([head, live[order]]), np.concatenate([np.full(nd, K_DEAD, dtype=np.int64), key[order]]))


def learn_shift_ref(rec, rec_w, blocks, writes, w_iter, it) -> list:
    """Per class (older data, this iteration's data) of blocks read and not written, the common difference of the
    two launches' blocks in address order: ``[ok_old, d_old, ok_new, d_new]``."""
    out = []
    for new in (False, True):
        r = rec[~rec_w.astype(bool) & ((w_iter[rec] == it) == new)]
        c = blocks[~np.isin(blocks, writes) & ((w_iter[blocks] == it) == new)]
        d = c - r if r.shape == c.shape else np.empty(0, dtype=np.int64)
        ok = r.size > 0 and r.shape == c.shape and bool((d == d[0]).all())
        out += [ok, int(d[0]) if ok else None]
    return out


class ReferencePolicy(UvmPrefetchPolicy):
    """``uvmprefetch`` with its launch, fault, eviction and free hooks in Python (see the module docstring)."""

    # ------------------------------------------------------------------------------ the parts' scalars
    def _get(self, part, f):
        return getattr(self, part).r[f].item()

    def _set(self, part, f, v):
        getattr(self, part).r[f] = v

    @property
    def p(self):
        return self.history.p

    @p.setter
    def p(self, v):
        self._set("history", "has_p", v is not None)
        self._set("history", "p", -1 if v is None else v)

    @property
    def base(self):
        return self._get("history", "base")

    @property
    def end(self):
        return self.history.end

    @property
    def it(self):
        return self._get("history", "iters")

    def _flat(self, name):
        return self.history.view(name)

    def _span(self, lo, hi):
        h = self.history
        hp = self._flat("h_ptr")
        fbase = self._get("history", "fbase")
        a = int(hp[lo - self.base]) - fbase
        b = (int(hp[hi - self.base]) - fbase) if hi < self.end else self._get("history", "fn")
        return a, b

    def _blocks_at(self, pos):
        a, b = self._span(pos, pos + 1)
        return self.history.f_blk[a:b]

    def _record_end(self, q):
        h = self.history
        starts = h.starts[:self._get("history", "n_starts")]
        later = starts[starts > q]
        return int(later[0]) if later.size else self._get("history", "iter_start")

    # ------------------------------------------------------------------------------------------ hooks
    def on_launch(self, info, state):
        known = bool(info.known_accesses)
        key = int(info.exec_id) & MASK63
        name = int(info.name)
        blocks = info.blocks if known else EMPTY
        writes = info.write_blocks if known else EMPTY
        self.stats["launches"] += 1
        sig = int(launch_sig(name, blocks)) if known else hash((key,))
        moves_now = self.stats["moved_blocks"] != self._get("moves", "moved_at_start")
        committed = bool(self._get("history", "pend"))
        if committed:
            self._commit_pending()
        stab, ngram = self._count(key, blocks, writes, known and self._get("correlation", "stable_sync"))
        if committed and self._get("history", "n") > self.params.history_launches:
            self._trim(self._get("history", "n") // 2)
        matched = self.stats["matched"]
        self._match(key, name, sig, stab, moves_now)
        run = self._get("plan", "exact_run")
        self._set("plan", "exact_run", run + 1 if self.stats["matched"] > matched else 0)
        p = self.p
        if known:
            if p is not None:
                self._learn(p, blocks, writes)
            wmask, again, late = self._launch_marks(blocks, writes, int(info.index), state)
            cur = blocks
        else:
            self.blocks.fresh[:] = False  # (no launch without accesses marks its blocks used)
            cur = self._blocks_at(p).copy() if p is not None else EMPTY
            again, late = self._cur_marks(cur, state) if cur.size else (0, 0)
            wmask = None
        self._set_pending(key, name, sig, cur, wmask, stab, ngram, float(info.duration))
        self.advice.r["compute_s"] += float(info.duration)
        self._set("plan", "waits", late > 0)
        if again and p is not None:
            self.stats["refetched_blocks"] += again
            self.monitor.thrash(info.index, again)
        if late:
            self.stats["late_blocks"] += late
            self.monitor.late(info.index, late)
        dec = self._plan(cur, state, float(info.duration))
        self.blocks.fresh[cur] = False
        if self.advice.pending:
            dec = dec or Decision()
            dec.advise = tuple(self.advice.pending)
            self.advice.pending = []
        return dec

    def on_fault(self, info, blocks):
        h = self.history
        if self._get("history", "pend") and not info.known_accesses:
            k = self._get("history", "pk")
            u = np.union1d(h.pbuf[:k], blocks)
            h.pbuf[:u.shape[0]] = u
            self._set("history", "pk", u.shape[0])
            self._set("history", "phas_w", False)
        self.advice.r["link_blocks"] += blocks.shape[0]
        if self.p is not None:
            pred = self._blocks_at(self.p)
            late = int(np.isin(blocks, pred).sum())
            if late:
                self.stats["predicted_faults"] += late
                self.monitor.late(info.index, late)

    def on_evict(self, blocks):
        self.blocks.dirty[blocks] = False
        self._note_thrash(blocks, None)

    def on_free(self, blocks):
        if self.invalidating:
            self.blocks.dead[blocks] = True

    # ------------------------------------------------------------------------------------------ history
    def _commit_pending(self):
        h, hr = self.history, self.history.r
        hn, fn, k = self._get("history", "n"), self._get("history", "fn"), self._get("history", "pk")
        self.history.grow()
        fbase = self._get("history", "fbase")
        r = self.base + hn
        f0 = fbase + fn
        blocks = h.pbuf[:k].copy()
        for arr, v in (("h_cum", hr["cum"]), ("h_key", hr["pkey"]), ("h_name", hr["pname"]), ("h_sig", hr["psig"]),
                       ("h_soft", hr["soft"]), ("h_ptr", f0)):
            getattr(h, arr)[hn] = v
        hr["cum"] += hr["pdur"]
        hr["n"], hr["fn"], hr["pend"] = hn + 1, fn + k, False
        h.f_blk[fn:fn + k] = blocks
        if hr["phas_w"]:
            h.f_w[fn:fn + k] = h.wbuf[:k]
        it = self.it  # (with ``boundary``, the last launch of the iteration before keeps that iteration)
        if self._get("history", "boundary") and r < self._get("history", "iter_start"):
            it -= 1
        new = h.first_it[blocks] != it
        h.first_it[blocks[new]] = it
        h.first_pos[blocks[new]] = r
        prev = h.last_flat[blocks]
        linked = prev >= fbase
        h.f_next[prev[linked] - fbase] = r
        h.last_flat[blocks] = f0 + np.arange(k)
        p = self.p if self.p is not None else -1
        nu = h.nu[blocks]
        idle = (nu >= INF) | (nu <= p)
        fp = h.first_pos[blocks]
        h.nu[blocks[idle]] = np.where(fp > p, fp, r)[idle]
        # the tables learn it
        c, cr = self.correlation, self.correlation.r
        stab, ngram = int(hr["pstab"]), int(hr["pngram"])
        cr["clock"] = assoc_put(c.sig_pos, int(hr["psig"]), r, cr["clock"])
        if stab:
            cr["clock"] = assoc_put(c.stab_pos, stab, r, cr["clock"])
        n = self.params.ngram
        m = int(cr["n_recent"])
        if m == n + 1:
            c.recent[:, :n] = c.recent[:, 1:].copy()
            m = n
        c.recent[0, m], c.recent[1, m] = hr["pkey"], hr["pname"]
        cr["n_recent"] = m + 1
        if m + 1 == n + 1:
            if ngram:
                cr["clock"] = assoc_put(c.exec_pos, ngram, r, cr["clock"])
            cr["clock"] = assoc_put(c.name_pos, seq_key(c.recent[1, :n], hr["pname"]), r, cr["clock"])

    def _count(self, key, blocks, writes, stable):
        c, cr = self.correlation, self.correlation.r
        n = self.params.ngram
        m = int(cr["n_recent"])
        ngram = 0
        if m >= n:
            g = seq_key(c.recent[0, m - n:m], key)
            ngram = int(mix64(g, assoc_count(c.ngram_count, g, self.it + 1)))
        stab = 0
        if stable:
            h = int(stable_sig(blocks, writes, self.blocks.w_iter, self.it, key))
            if h:
                stab = int(mix64(h, assoc_count(c.stab_count, h, self.it + 1)))
        cr["ngram"] = ngram
        return stab, ngram

    def _trim(self, k):
        h, hr = self.history, self.history.r
        n, fn = int(hr["n"]), int(hr["fn"])
        cut = int(h.h_ptr[k])
        fk = cut - int(hr["fbase"])
        for arr, m, fill in (("h_cum", k, 0), ("h_key", k, 0), ("h_name", k, 0), ("h_sig", k, 0), ("h_soft", k, 0),
                             ("h_ptr", k, 0), ("f_blk", fk, 0), ("f_w", fk, 0), ("f_next", fk, INF)):
            a = getattr(h, arr)
            length = n if arr.startswith("h_") else fn
            a[:length - m] = a[m:length].copy()
            a[length - m:length] = fill
        hr["n"], hr["fn"] = n - k, fn - fk
        hr["base"] += k
        hr["fbase"] = cut
        if self.p is not None and self.p < self.base:
            self.p = None
        pr = self.plan.r
        pr["v_lo"], pr["v_hi"] = 0, -1
        pr["horizon"] = max(int(pr["horizon"]), self.base)

    def _set_pending(self, key, name, sig, cur, wmask, stab, ngram, dur):
        h, hr = self.history, self.history.r
        k = cur.shape[0]
        h.pbuf[:k] = cur
        if wmask is not None:
            h.wbuf[:k] = wmask
        hr["pend"], hr["pk"], hr["phas_w"] = True, k, wmask is not None
        hr["pkey"], hr["pname"], hr["psig"], hr["pstab"], hr["pngram"], hr["pdur"] = key, name, sig, stab, ngram, dur

    # ------------------------------------------------------------------------------------------ the match
    def _tab(self, table, key):
        cr = self.correlation.r
        v, cr["clock"] = assoc_get(getattr(self.correlation, table), key, cr["clock"])
        return int(v) if v >= 0 else None

    def _match(self, key, name, sig, stab, moves_now):
        """Most specific first: the next recorded launch with the same signature, the last position with it (not a
        repeat inside this iteration while following a later record than the cold one; with ``follow_cold``, once
        it acts (``_visit``), not anywhere while following the cold record and this kernel comes next there), the
        stable signature (into this iteration's and the last one's records only), the next launch by name, then the
        n-gram tables."""
        h, st = self.history, self.stats
        self._set("history", "soft", 0)
        base, end, p = self.base, self.end, self.p
        nxt = p + 1 if p is not None else None
        hsig, hname, hkey = self._flat("h_sig"), self._flat("h_name"), self._flat("h_key")
        it_start = self._get("history", "iter_start")
        starts = h.starts[:self._get("history", "n_starts")]
        if nxt is not None and nxt < end and hsig[nxt - base] == sig:
            st["matched"] += 1
            return self._advance(nxt, moves_now)
        q = self._tab("sig_pos", sig)
        if q is not None and nxt is not None and q != nxt and nxt < it_start and hname[nxt - base] == name:
            if starts.size and starts[0] <= nxt:  # (a later record than the cold one)
                if q >= it_start or (self._get("correlation", "follow_later") and q < nxt
                                     and (moves_now or int(starts[starts <= nxt][-1]) <= q)):
                    q = None
            elif self._get("correlation", "cold_on"):
                q = None
        if (q is None or not base <= q < end) and stab:
            q2 = self._tab("stab_pos", stab)
            if (q2 is not None and max(self._get("history", "prev_start"), base) <= q2 < end
                    and hkey[q2 - base] == key and q2 != nxt):
                st["stable_resync"] += 1
                self._set("history", "soft", 1)
                self._visit(p, q2)
                return self._jump(q2)
        if q is None or not base <= q < end:
            if nxt is not None and nxt < end and hname[nxt - base] == name:
                self._set("history", "soft", 2 if self._flat("h_soft")[nxt - base] else 1)
                st["soft"] += 1
                return self._advance(nxt, moves_now)
            n = self.params.ngram
            q = None
            if self._get("correlation", "n_recent") >= n:
                ngram = self._get("correlation", "ngram")
                q = self._tab("exec_pos", ngram) if ngram else None
                if q is None or not base <= q < end:
                    c = self.correlation
                    m = self._get("correlation", "n_recent")
                    q = self._tab("name_pos", seq_key(c.recent[1, m - n:m], name))
            if q is None or not base <= q < end:
                self.p = None
                st["unpredicted"] += 1
                return
        if q == nxt:
            st["matched"] += 1
            return self._advance(q, moves_now)
        st["resync"] += 1
        self._visit(p, q)
        self._jump(q)

    def _visit(self, p, q):
        """``follow_cold`` acts once the pointer's visits from the cold record to this step's earlier launches last
        ``follow_cold_visit`` launches on average (from the end of the second on)."""
        cr = self.correlation.r
        if p is None or not cr["follow_cold"] or cr["cold_on"]:
            return
        it_start = self._get("history", "iter_start")
        starts = self.history.starts[:self._get("history", "n_starts")]
        n = self.stats["launches"]
        if p < it_start <= q and (not starts.size or p < starts[0]):
            cr["visit_at"] = n
        elif q < it_start <= p and cr["visit_at"] >= 0:
            cr["visits"] += 1
            cr["visited"] += n - cr["visit_at"]
            cr["visit_at"] = -1
            cr["cold_on"] = cr["visits"] >= 2 and cr["visited"] >= self.params.follow_cold_visit * cr["visits"]

    def _remap_lim(self, p, moves_now):
        it_start = self._get("history", "iter_start")
        if not self.params.track_moves or not moves_now or p is None or p >= it_start:
            return 0
        return self._record_end(p)

    def _advance(self, q, moves_now):
        h, mv = self.history, self.moves
        self.p = q
        lim = self._remap_lim(q, moves_now)
        if lim:
            self.plan.r["v_lo"], self.plan.r["v_hi"] = 0, -1
        a, b = self._span(q, q + 1)
        dead = self.blocks.dead
        dead_births, dead_misses = self._get("moves", "dead_births"), self._get("moves", "dead_misses")
        for i in range(a, b):
            x, nx = int(h.f_blk[i]), int(h.f_next[i])
            if lim and q < lim:
                y = int(mv.remap[x])
                if y != x:
                    # (a dead address whose predicted births went elsewhere dead_misses times in a row: none)
                    if nx >= mv.rend[x] and not (dead[x] and 0 < dead_misses <= mv.missed[x]):
                        h.nu[x] = nx
                    if dead_births and h.f_w[i] == 0 and dead[y] and nx < lim:
                        nx = self._next_birth(x, nx - 1, lim)  # (dead memory is written before it is read)
                    if nx >= lim and h.first_it[y] == self.it:
                        nx = int(h.first_pos[y])
                x = y
            h.nu[x] = nx

    def _jump(self, q):
        h = self.history
        self.p = q
        pr = self.plan.r
        pr["horizon"] = q + 1
        pr["v_lo"], pr["v_hi"] = 0, -1
        self.victims.r["on"] = False
        h.nu[:] = INF
        if q + 1 < self.end:
            a, b = self._span(q + 1, self.end)
            b = min(b, a + self.params.scan_max)
            pos = self._positions(q + 1, a, b)
            blk = h.f_blk[a:b]
            h.nu[blk[::-1]] = pos[::-1]  # (the first entry of a block wins)

    def _positions(self, lo, a, b):
        """The history position of each flat entry in ``[a, b)``, the entries of positions from ``lo`` on."""
        hp = self._flat("h_ptr")[lo - self.base:] - self._get("history", "fbase")
        return lo + np.searchsorted(hp, np.arange(a, b), side="right") - 1

    # ------------------------------------------------------------------------------------------ learning
    def _learn(self, p, blocks, writes):
        it_start = self._get("history", "iter_start")
        if self.params.track_moves and p < it_start:
            self._learn_moves(p, writes, self._record_end(p))
        if self._get("history", "soft") and p >= it_start and self.params.layer_stride:
            a, b = self._span(p, p + 1)
            h, mv = self.history, self.moves
            ok_o, d_o, ok_n, d_n = learn_shift_ref(h.f_blk[a:b], h.f_w[a:b], blocks, writes, self.blocks.w_iter,
                                                   self.it)
            if ok_o:
                mv.r["s_old"] = d_o
            if ok_n:
                mv.r["s_new"] = d_n
            if ok_o or ok_n:
                self.victims.r["on"] = False
            if mv.r["s_old"] or mv.r["s_new"]:
                mv.r["shift_it"] = True

    def _next_birth(self, x, p, lim):
        """The first position after ``p`` and before ``lim`` where the record writes a new tensor into block ``x``
        (an entry with ``f_w`` 2); ``lim`` if none."""
        h = self.history
        fn = self._get("history", "fn")
        at = np.flatnonzero((h.f_blk[:fn] == x) & (h.f_w[:fn] == 2))
        t = self._positions(self.base, 0, fn)[at]
        t = t[(t > p) & (t < min(lim, self.end))]
        return int(t[0]) if t.size else lim

    def _learn_moves(self, p, writes, rec_end):
        h, mv, st = self.history, self.moves, self.stats
        a, b = self._span(p, p + 1)
        fw = h.f_w[a:b]
        rec = h.f_blk[a:b][fw != 0]
        if rec.shape[0] != writes.shape[0] or not rec.size:
            return
        nu = h.nu
        mvd = rec != writes
        vals = nu[rec[mvd]].copy()
        settled = 0
        for x, w in zip(rec.tolist(), writes.tolist()):
            y = int(mv.remap[x])
            if y != x and y != w and h.first_it[y] == self.it:
                nu[y] = h.first_pos[y]
                settled += 1
            if x != w:
                if not self.blocks.dead[x]:
                    mv.missed[x] = 0
                elif 0 < p == mv.rend[x]:  # (the birth predicted here went elsewhere)
                    mv.missed[x] += 1
                mv.remap[x] = w
                mv.moved_to[w] = True
                e = self._next_birth(x, p, rec_end)
                mv.rend[x] = e
                misses = self._get("moves", "dead_misses")
                if e < rec_end and not 0 < misses <= mv.missed[x]:
                    nu[x] = e
            elif y != x:
                mv.remap[x], mv.rend[x], mv.missed[x] = x, 0, 0
                settled += 1
        nu[writes[mvd]] = vals
        moved = int(mvd.sum())
        if moved or settled:
            self.victims.r["on"] = False
            self.plan.r["v_lo"], self.plan.r["v_hi"] = 0, -1
        st["moved_blocks"] += moved

    # ------------------------------------------------------------------------------------------ marks
    def _launch_marks(self, blocks, writes, index, state):
        bs = self.blocks
        wmask = np.zeros(blocks.shape[0], dtype=np.int8)
        wmask[np.searchsorted(blocks, writes)] = np.where(bs.dead[writes] | bs.fresh[writes], 2, 1)
        bs.dead[blocks] = False
        bs.fresh[blocks[wmask == 0]] = False  # (the written ones once the decision is made)
        bs.pf_unused[blocks] = False
        bs.uses[blocks] += 1
        bs.last_use[blocks] = index
        bs.dirty[writes] = True
        bs.written[writes] = True
        bs.w_iter[writes] = self.it
        again, late = self._cur_marks(blocks, state)
        return wmask, again, late

    def _cur_marks(self, cur, state):
        bs = self.blocks
        thr = bs.thrashed[cur].copy()
        late = int(state.in_flight[cur].sum())
        bs.thrashed[cur] = False
        again = int((thr & ~state.resident[cur]).sum())
        return again, late

    def _note_thrash(self, blocks, lim):
        bs, nu = self.blocks, self.history.nu
        p = self.p if self.p is not None else -1
        unused = blocks[bs.pf_unused[blocks]]
        bs.pf_unused[unused] = False
        v = nu[unused]
        ahead = (v > p) & (v < INF) & ((v <= lim) if lim is not None else True)
        bs.thrashed[unused[ahead]] = True
        self.stats["thrash_blocks"] += int(ahead.sum())
        self.stats["mispredicted_blocks"] += int(((v <= p) | (v >= INF)).sum())

    # ------------------------------------------------------------------------------------------ the plan
    def _candidates(self, miss, nxt_span, scanned, p, present):
        """The candidates in order of need: the running launch's misses (position -1), the next launch's entries
        (``nxt_span``), the scanned span (``scanned``: flat ``[sa, sb)`` of positions from ``lo``); recorded blocks
        translated and shifted; next uses brought to the earliest candidate position ahead of ``p``; then blocks
        ``present``, repeats and (``moved_births``) translated first writes into blocks holding live data dropped."""
        h, mv, bs = self.history, self.moves, self.blocks
        (pa, pb), (sa, sb, lo) = nxt_span, scanned
        cand_b, cand_p = [miss], [np.full(miss.shape[0], -1, dtype=np.int64)]
        cand_w = [np.zeros(miss.shape[0], dtype=np.int8)]
        if pb > pa:
            cand_b.append(h.f_blk[pa:pb])
            cand_p.append(np.full(pb - pa, p + 1, dtype=np.int64))
            cand_w.append(h.f_w[pa:pb])
        if sb > sa:
            cand_b.append(h.f_blk[sa:sb])
            cand_p.append(self._positions(lo, sa, sb))
            cand_w.append(h.f_w[sa:sb])
        blk, pos, fw = np.concatenate(cand_b), np.concatenate(cand_p), np.concatenate(cand_w)
        tr = np.zeros(blk.shape[0], dtype=bool)
        lim = self._remap_lim(self.p, self.stats["moved_blocks"] != self._get("moves", "moved_at_start"))
        if self.p is not None and lim:
            tr = (pos >= 0) & (pos < lim)
            y = np.where(tr, mv.remap[blk], blk)
            if self._get("moves", "dead_births"):  # (a dead block is not read: not brought nearer, not listed)
                read_dead = tr & (y != blk) & (fw == 0) & bs.dead[y]
                blk, pos, fw, tr, y = blk[~read_dead], pos[~read_dead], fw[~read_dead], tr[~read_dead], y[~read_dead]
            both = tr & (y != blk) & (pos >= mv.rend[blk]) & ~bs.dead[blk]
            order = np.repeat(np.arange(blk.shape[0]), np.where(both, 2, 1))
            second = np.zeros(order.shape[0], dtype=bool)
            second[1:] = order[1:] == order[:-1]
            blk, pos, fw, tr = np.where(second, blk[order], y[order]), pos[order], fw[order], tr[order]
        s_old, s_new = int(mv.r["s_old"]), int(mv.r["s_new"])
        it_start = self._get("history", "iter_start")
        self._plain = not lim and not (self.p is not None and self.p >= it_start and (s_old or s_new))
        if self.p is not None and self.p >= it_start and (s_old or s_new):
            y = blk + np.where(bs.w_iter[blk] != self.it, s_old, s_new)
            blk = np.where((pos >= it_start) & (y >= 0) & (y < h.nu.shape[0]), y, blk)
        if self.p is not None:
            old = h.nu[blk]
            upd = (pos > p) & ((old <= p) | (old > pos))
            h.nu[blk[upd][::-1]] = pos[upd][::-1]
        keep = ~present[blk]
        if self._get("plan", "moved_births"):
            keep &= ~(tr & (fw == 2))
        blk, pos = blk[keep], pos[keep]
        _, first = np.unique(blk, return_index=True)
        first.sort()
        return blk[first], pos[first]

    def _scan(self, lo, hi, cap, present):
        """The window pass's extent: chunks of 16, 32, ... positions from ``lo`` while fewer than ``cap`` scanned
        blocks are missing, at most ``scan_max`` entries. Returns ``(scan_hi, sa, sb)``."""
        got, start, chunk, scan_hi, spanned = 0, lo, 16, self.p, 0
        sa = sb = self._span(lo, lo + 1)[0]
        while start <= hi and got < cap and spanned < self.params.scan_max:
            stop = min(hi, start + chunk - 1)
            a, b = self._span(start, stop + 1)
            if b > a:
                got += int((~present[self.history.f_blk[a:b]]).sum())
                spanned += b - a
                sb = b
            scan_hi = stop
            start = stop + 1
            chunk *= 2
        return scan_hi, sa, sb

    def _plan(self, cur, state, dur):
        P, pr, bs, h = self.params, self.plan.r, self.blocks, self.history
        p = self.p
        n_ids = min(int(getattr(state, "n_ids", state.resident.shape[0])), state.resident.shape[0])
        res, infl = state.resident[:n_ids], state.in_flight[:n_ids]
        present = res | infl
        t_blk, lead, margin = self.t_blk, P.lead_s, int(pr["margin"])
        waits = P.stall_aware and bool(pr["waits"])
        miss = cur[~present[cur]] if cur.size else EMPTY
        pa = pb = sa = sb = lo = 0
        scan_hi = p if p is not None else -1
        q = max(float(pr["q_end"]), state.now)
        free = max(0, state.capacity_blocks - state.used_blocks - margin)
        # (``driver_victims``: at an exact match the driver chooses the victims, as without ``pre_evict``)
        own = P.pre_evict and not (pr["driver_victims"] and p is not None and not self._get("history", "soft")
                                   and pr["exact_run"] >= pr["dv_run"])
        paced = P.pace and own and t_blk > 0
        if P.prefetch and p is not None:
            lo = max(p + 1, int(pr["horizon"]))
            hi = min(p + self.monitor.window, self.end - 1)
            if lo > p + 1:
                pa, pb = self._span(p + 1, p + 2)
            if lo <= hi:
                if paced:
                    spare = (dur + lead) / t_blk if waits else (state.now + dur + lead - q) / t_blk
                    cap = free + max(0, int(spare)) + 8
                else:
                    cap = free + state.capacity_blocks
                if free == 0 and cap <= 8:
                    hi = min(hi, p + 1)
                scan_hi, sa, sb = self._scan(lo, hi, cap, present)
        if not (miss.size or pb > pa or sb > sa):
            return self._margin(cur, state, res) if own and margin else None
        pw = p if p is not None else -1
        blk, pos = self._candidates(miss, (pa, pb), (sa, sb, lo), pw, present)
        n = blk.shape[0]
        near = pw + 1 if p is not None else -1
        evict = discard = EMPTY
        if not own:
            placed = min(n, max(int((pos <= near).sum()), free))
        else:
            placed = min(free, n)
            rest = n - placed
            if rest and paced:
                until = state.now + dur + lead + (max(0.0, q - state.now) if waits else 0.0)
                soft = self._get("history", "soft")
                # (``writeback_clock``: at a soft match from the later of the queue's end and the victims' write-backs)
                qb = max(q, float(pr["d_end"])) if pr["writeback_clock"] and soft else q
                room = (until - (qb + placed * t_blk)) / t_blk
                budget = max(0, int(np.ceil(room) if not soft else room))
                if pr["batch"] > 1 and not soft and budget > 0:  # (``batch_share``: at least a batch at once)
                    budget = max(budget, int(pr["batch"]))
                k = min(rest, int((pos[placed:] <= near).sum()) + budget)
                t_last = int(pos[placed + k - 1]) if 0 < k < rest else -1
                # (``whole``: the last launch whole, on a plain pass, where that launch matched exactly when recorded)
                if (pr["whole"] and not soft and budget > 0 and self._plain and self.base <= t_last < self.end
                        and not self._flat("h_soft")[t_last - self.base]):
                    kw = int((pos[placed:] <= t_last).sum())
                    ext = blk[placed + k:placed + kw]
                    if (~(bs.dead[ext] | bs.fresh[ext])).any():  # (only where the blocks it adds bring data)
                        k = kw
                rest = k
            if rest:
                keys = (bs.dead, h.nu, bs.dirty, bs.last_use, P.dead_reuse, int(self.victims.s[0]["gmask"]))
                vict, vkey = victims_ref(res, cur, keys, pw, rest)
                exact = np.where(vkey >= INF, vkey, h.nu[vict])  # (the need check: the exact next use)
                ok = exact <= pos[placed:placed + vkey.shape[0]]
                k_ok = int(np.argmax(ok)) if ok.any() else vkey.shape[0]
                if k_ok:
                    chosen = vict[:k_ok]
                    d = bs.dead[chosen]
                    evict, discard = chosen[~d], chosen[d]
                    nd = int((bs.dirty[chosen] & ~d).sum())  # (each dirty live victim's data leaves before its room frees)
                    if pr["writeback_clock"] and nd:
                        pr["d_end"] = max(float(pr["d_end"]), state.now) + nd * t_blk
                    self._note_thrash(chosen, near + max(1, self.monitor.window // 8))
                    bs.dirty[chosen] = False
                    self.stats["evicted_blocks"] += evict.shape[0]
                    self.stats["discarded_blocks"] += discard.shape[0]
                placed += k_ok
        pf = pop = EMPTY
        k = self._get("history", "pk")
        # the running launch's first writes into dead memory move no data (``first_writes_free``; its marks took them
        # for live)
        first = h.pbuf[:k][h.wbuf[:k] == 2] if self._get("history", "phas_w") else EMPTY
        free_fw = first if P.first_writes_free else EMPTY
        if P.prefetch:
            pf, pp = blk[:placed], pos[:placed]
            if pf.size and q > state.now + float(pr["lat"]):
                keep = pp >= 0  # the running launch's misses fault instead, but for its first writes into dead memory
                if pr["populate"] and self._get("history", "phas_w"):
                    pop = pf[(pp < 0) & np.isin(pf, first)]
                if P.fault_late_soft and p is not None and p + 1 < self.end and self._flat("h_soft")[p + 1 - self.base]:
                    arrive = q + t_blk * np.cumsum(~(bs.dead[pf] | bs.fresh[pf] | np.isin(pf, free_fw)))
                    keep &= ~((pp == p + 1) & (arrive > state.now + dur + float(pr["lat"]))
                              & (bs.w_iter[pf] != self.it))
                pf = pf[keep]
            if p is not None:
                if placed == n:
                    pr["horizon"] = max(int(pr["horizon"]), scan_hi + 1)
                elif placed:
                    pr["horizon"] = max(int(pr["horizon"]), int(pos[placed]) if pos[placed] >= 0 else p + 1)
        if pop.size:
            bs.pf_unused[pop] = True
            self.stats["populated_blocks"] += pop.shape[0]
        if pf.size:
            bs.pf_unused[pf] = True
            live = int((~(bs.dead[pf] | bs.fresh[pf] | np.isin(pf, free_fw))).sum())
            pr["q_end"] = q + live * t_blk
            self.stats["prefetched_blocks"] += pf.shape[0]
            self.advice.r["link_blocks"] += live
        if not (pf.size or evict.size or discard.size or pop.size):
            return None
        return Decision(prefetch=pf, evict=evict, discard=discard, populate=pop)

    def _margin(self, cur, state, res):
        short = int(self.plan.r["margin"]) - (state.capacity_blocks - state.used_blocks)
        if short <= 0:
            return None
        bs = self.blocks
        p = self.p if self.p is not None else -1
        vict, vkey = victims_ref(res, cur, (bs.dead, self.history.nu, bs.dirty, bs.last_use, self.params.dead_reuse,
                                  int(self.victims.s[0]["gmask"])),
                                 p, short)
        vict = vict[vkey > INF]  # only dead or unpredicted blocks go for the margin
        if not vict.size:
            return None
        d = bs.dead[vict]
        bs.dirty[vict] = False
        return Decision(evict=vict[~d], discard=vict[d])
