// gate.cpp: pre-op gating. The observer calls gate_check from an op's RecordFunction start callback, on the
// thread that is about to queue the op's kernels. For each 2 MiB block the op touches, the table below says
// what the mover has done with it: when a move to the GPU (or a discard) of the block is still in flight, the
// op's stream is made to wait on that move's CUDA event (cudaStreamWaitEvent: asynchronous, the training
// thread does not wait), and only then. Evictions are never waited on: an op that needs a block on its way
// to the host faults it back, which the driver orders correctly; making the op wait would only add the
// eviction's time to the training thread's stream.
//
// The same lookups are the exact monitor: blocks in flight to the GPU when the op was issued are late
// prefetches; blocks known to be on the host (or leaving) will fault.
//
// The table is written by one thread (the mover, through uvmgate_set) and read by any number of op threads
// without locks: a slot's key (block number + 1) is published after its value, and a value is one 64-bit word
// (the event pointer, 8-byte aligned, with the state in its low 3 bits), so a reader never sees a torn pair.
// libcudart is resolved at run time with dlsym, so this builds without CUDA headers.
//
// The copy path (runtime/copyout.py) adds one state, kMirrored: the block's data is in a pinned host mirror and its
// GPU pages are (being) discarded, so a kernel that touched it now would read garbage where a fault would have been
// correct. An op over such a block *demands* it: the block goes into the demand ring and the op's thread waits
// (releasing the GIL if it holds it, so the mover thread can run) until the mover has issued the block's copy-in
// and set it kToGpu with the copy's event; then the op's stream waits on that event as for any move to the GPU.
#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "uvmobs.h"

#define UVM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

enum BlockState : uint64_t {
    kUnknown = 0,   // never moved by us: the driver's business
    kResident = 1,  // on the GPU
    kToGpu = 2,     // a prefetch to the GPU is in flight (event)
    kToHost = 3,    // an eviction is in flight (event): never waited on
    kOnHost = 4,    // evicted
    kDiscard = 5,   // a discard is in flight (event): a later op must wait (it may reuse the memory)
    kMirrored = 6,  // copied out to a host mirror and discarded: an op demands its copy-in and waits for it
};

using WaitFn = int (*)(void* stream, void* event, unsigned flags);      // cudaStreamWaitEvent
using CreateFn = int (*)(void** event, unsigned flags);                 // cudaEventCreateWithFlags
using RecordFn = int (*)(void* event, void* stream);                    // cudaEventRecord
using QueryFn = int (*)(void* event);                                   // cudaEventQuery (0: done)
using CapturingFn = int (*)(void* stream, int* status);                 // cudaStreamIsCapturing

constexpr size_t kSlots = size_t(1) << 18;  // 262144 blocks: 512 GiB of 2 MiB blocks
struct Slot {
    std::atomic<uint64_t> key{0};  // block number + 1; 0 = empty
    std::atomic<uint64_t> val{0};  // event pointer | state
};
Slot g_slots[kSlots];
std::atomic<uint64_t> g_used{0};
std::atomic<int> g_shift{21};
std::atomic<WaitFn> g_wait{nullptr};
std::atomic<CreateFn> g_create{nullptr};
std::atomic<RecordFn> g_record{nullptr};
std::atomic<QueryFn> g_query{nullptr};
std::atomic<CapturingFn> g_capturing{nullptr};
std::atomic<uint64_t> g_wait_errors{0}, g_full{0};

// Demands for copy-ins (kMirrored blocks an op needs): a ring of block numbers, written by op threads, read by the
// mover (uvmgate_take_demands). A block may be listed more than once; the reader skips what is no longer mirrored.
constexpr size_t kDemands = 4096;
std::atomic<uint64_t> g_demand[kDemands];
std::atomic<uint64_t> g_demand_head{0}, g_demand_tail{0}, g_demanded{0}, g_demand_wait_ns{0};
using GilCheckFn = int (*)();          // PyGILState_Check
using SaveFn = void* (*)();            // PyEval_SaveThread
using RestoreFn = void (*)(void*);     // PyEval_RestoreThread
std::atomic<GilCheckFn> g_gil_check{nullptr};
std::atomic<SaveFn> g_gil_save{nullptr};
std::atomic<RestoreFn> g_gil_restore{nullptr};

// GPU progress: every `g_every`-th observed op records an event on its stream after its kernels; the planner asks
// how far the GPU got (uvmgate_completed_seq) without a sync. Producers (op threads) reserve a slot, consumers
// (the planner) take them in order; an event is created once per slot and reused.
constexpr size_t kMarks = 1024;
struct Mark {
    std::atomic<uint64_t> seq{0};  // 0: free or not yet recorded
    void* event = nullptr;
};
Mark g_marks[kMarks];
std::atomic<uint64_t> g_mark_head{0}, g_mark_tail{0}, g_marks_dropped{0}, g_completed{0};
std::atomic<int> g_every{8};
thread_local unsigned t_ops = 0;

size_t home(uint64_t block) { return (block * 0x9E3779B97F4A7C15ULL) >> (64 - 18); }

Slot* find(uint64_t block, bool insert) {
    const uint64_t key = block + 1;
    size_t i = home(block);
    for (size_t probe = 0; probe < kSlots; ++probe, i = (i + 1) & (kSlots - 1)) {
        uint64_t k = g_slots[i].key.load(std::memory_order_acquire);
        if (k == key) return &g_slots[i];
        if (k == 0) {
            if (!insert) return nullptr;
            if (g_used.load(std::memory_order_relaxed) >= kSlots * 3 / 4) {  // full: that block stays ungated
                g_full.fetch_add(1, std::memory_order_relaxed);
                return nullptr;
            }
            g_used.fetch_add(1, std::memory_order_relaxed);
            return &g_slots[i];  // the caller stores the value, then the key
        }
    }
    return nullptr;
}

// Ops between their gate check and their end callback, per thread (`in` counts checks started, `out` ops ended or
// blocked on a demand): a copy-out marks its blocks kMirrored, then waits (uvmgate_quiesce) until every op that
// was past the gate then has queued its kernels, and only then orders itself after the compute stream. An op
// whose check comes after the mark sees it and demands; one blocked on a demand counts as out, and checks all its
// blocks again when it resumes (a block it passed before may have been marked meanwhile).
constexpr size_t kThreads = 256;
struct OpCount {
    std::atomic<uint64_t> in{0}, out{0};
};
OpCount g_ops[kThreads];
std::atomic<size_t> g_nthreads{0};
thread_local OpCount* t_ops_count = nullptr;
thread_local bool t_ops_init = false;

OpCount* my_count() {
    if (!t_ops_init) {
        t_ops_init = true;
        const size_t i = g_nthreads.fetch_add(1);
        t_ops_count = i < kThreads ? &g_ops[i] : nullptr;
    }
    return t_ops_count;
}

void op_in() {
    if (OpCount* c = my_count()) c->in.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the count is visible before the table is read
}

void op_out() {
    if (OpCount* c = my_count()) c->out.fetch_add(1, std::memory_order_release);
}

void demand(uint64_t block) {
    uint64_t slot = g_demand_head.load(std::memory_order_relaxed);
    while (slot - g_demand_tail.load(std::memory_order_acquire) >= kDemands) sched_yield();  // reader behind
    while (!g_demand_head.compare_exchange_weak(slot, slot + 1, std::memory_order_acq_rel)) {
        if (slot - g_demand_tail.load(std::memory_order_acquire) >= kDemands) sched_yield();
    }
    g_demand[slot % kDemands].store(block + 1, std::memory_order_release);
    g_demanded.fetch_add(1, std::memory_order_relaxed);
}

// Wait until `s` leaves kMirrored (the mover issued the copy-in, or restored the block and switched the path off),
// without the GIL: the mover thread that serves the demand is a Python thread.
uint64_t wait_unmirrored(Slot* s) {
    uint64_t v = s->val.load(std::memory_order_acquire);
    if ((v & 7) != kMirrored) return v;
    const auto t0 = std::chrono::steady_clock::now();
    GilCheckFn check = g_gil_check.load(std::memory_order_relaxed);
    SaveFn save = g_gil_save.load(std::memory_order_relaxed);
    RestoreFn restore = g_gil_restore.load(std::memory_order_relaxed);
    void* ts = (check && save && restore && check()) ? save() : nullptr;
    const timespec pause{0, 50000};  // 50 us: the mover looks for demands every ~2 ms
    while (((v = s->val.load(std::memory_order_acquire)) & 7) == kMirrored) nanosleep(&pause, nullptr);
    if (ts != nullptr) restore(ts);
    g_demand_wait_ns.fetch_add(uint64_t((std::chrono::steady_clock::now() - t0).count()), std::memory_order_relaxed);
    return v;
}

}  // namespace

namespace uvm {

bool gate_armed() { return g_used.load(std::memory_order_relaxed) != 0; }

void gate_op_end() { op_out(); }

void gate_check(const uint64_t* starts, const uint64_t* lengths, size_t n, void* stream, GateResult& out) {
    const int shift = g_shift.load(std::memory_order_relaxed);
    WaitFn wait = g_wait.load(std::memory_order_relaxed);
    thread_local std::vector<uint64_t> blocks;  // the op's blocks, each once (its tensors often share blocks)
    blocks.clear();
    for (size_t r = 0; r < n; ++r) {
        if (lengths[r] == 0) continue;
        const uint64_t first = starts[r] >> shift, last = (starts[r] + lengths[r] - 1) >> shift;
        for (uint64_t b = first; b <= last; ++b) blocks.push_back(b);
    }
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    void* waited[8];
    size_t nw = 0;
    op_in();
restart:
    for (uint64_t b : blocks) {
        Slot* s = find(b, false);
        if (s == nullptr) continue;
        uint64_t v = s->val.load(std::memory_order_acquire);
        if ((v & 7) == kMirrored) {  // copied out: never run on it before its copy-in is queued
            op_out();  // blocked: a copy-out waiting for ops past the gate must not wait for this one
            demand(b);
            wait_unmirrored(s);
            op_in();
            out = GateResult{};  // every block again: one passed before may have been marked meanwhile
            nw = 0;
            goto restart;
        }
        const uint64_t state = v & 7;
        void* ev = reinterpret_cast<void*>(v & ~uint64_t(7));
        if (state == kToHost || state == kOnHost) {
            if (out.fault < GateResult::kListMax) out.fault_blocks[out.fault] = b;
            ++out.fault;
            continue;
        }
        if (state != kToGpu && state != kDiscard) continue;
        if (state == kToGpu) {
            if (out.late < GateResult::kListMax) out.late_blocks[out.late] = b;
            ++out.late;
        }
        if (ev == nullptr || wait == nullptr) continue;
        bool seen = false;
        for (size_t i = 0; i < nw; ++i) seen = seen || waited[i] == ev;
        if (seen) continue;
        if (nw < 8) waited[nw++] = ev;
        if (wait(stream, ev, 0) != 0) g_wait_errors.fetch_add(1, std::memory_order_relaxed);
        ++out.waits;
    }
}

bool stream_capturing(void* stream) {
    CapturingFn fn = g_capturing.load(std::memory_order_relaxed);
    int status = 0;
    return fn != nullptr && fn(stream, &status) == 0 && status != 0;
}

void progress_note(uint64_t seq, void* stream) {
    RecordFn rec = g_record.load(std::memory_order_relaxed);
    if (rec == nullptr || (++t_ops % unsigned(g_every.load(std::memory_order_relaxed))) != 0) return;
    uint64_t slot = g_mark_head.load(std::memory_order_relaxed);
    do {
        if (slot - g_mark_tail.load(std::memory_order_acquire) >= kMarks) {  // the planner is far behind
            g_marks_dropped.fetch_add(1, std::memory_order_relaxed);
            return;
        }
    } while (!g_mark_head.compare_exchange_weak(slot, slot + 1, std::memory_order_relaxed));
    Mark& m = g_marks[slot % kMarks];
    if (m.event == nullptr) {
        CreateFn create = g_create.load(std::memory_order_relaxed);
        if (create == nullptr || create(&m.event, 2 /* cudaEventDisableTiming */) != 0) m.event = nullptr;
    }
    if (m.event == nullptr || rec(m.event, stream) != 0) {
        m.seq.store(~uint64_t(0), std::memory_order_release);  // nothing to wait for: a step-over sentinel
        return;
    }
    m.seq.store(seq, std::memory_order_release);
}

}  // namespace uvm

// The newest op seq the GPU has finished, as far as the recorded progress events say (never goes back).
UVM_EXPORT uint64_t uvmgate_completed_seq() {
    QueryFn query = g_query.load(std::memory_order_relaxed);
    uint64_t tail = g_mark_tail.load(std::memory_order_relaxed);
    const uint64_t head = g_mark_head.load(std::memory_order_acquire);
    while (tail < head) {
        Mark& m = g_marks[tail % kMarks];
        const uint64_t seq = m.seq.load(std::memory_order_acquire);
        if (seq == 0) break;  // reserved, not recorded yet
        if (seq != ~uint64_t(0)) {
            if (query == nullptr || query(m.event) != 0) break;  // not reached by the GPU yet
            if (seq > g_completed.load(std::memory_order_relaxed)) g_completed.store(seq, std::memory_order_relaxed);
        }
        m.seq.store(0, std::memory_order_relaxed);
        ++tail;
        g_mark_tail.store(tail, std::memory_order_release);
    }
    return g_completed.load(std::memory_order_relaxed);
}

UVM_EXPORT void uvmgate_set_progress_every(int k) { g_every.store(k < 1 ? 1 : k); }

// What the observer's end callback does for an op on `stream` (tests).
UVM_EXPORT void uvmgate_note(uint64_t seq, void* stream) { uvm::progress_note(seq, stream); }

// Resolve cudaStreamWaitEvent (and the event and capture calls) from `lib` (a path or soname; NULL: the
// libcudart already loaded, else libcudart.so.13). Returns 0 when found; -1 (and no waits, only counts) otherwise.
UVM_EXPORT int uvmgate_init(const char* lib) {
    const char* names[] = {lib, "libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (const char* name : names) {
        if (name == nullptr) continue;
        void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (h == nullptr) h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) continue;
        if (auto fn = reinterpret_cast<WaitFn>(dlsym(h, "cudaStreamWaitEvent"))) {
            g_wait.store(fn);
            g_create.store(reinterpret_cast<CreateFn>(dlsym(h, "cudaEventCreateWithFlags")));
            g_record.store(reinterpret_cast<RecordFn>(dlsym(h, "cudaEventRecord")));
            g_query.store(reinterpret_cast<QueryFn>(dlsym(h, "cudaEventQuery")));
            g_capturing.store(reinterpret_cast<CapturingFn>(dlsym(h, "cudaStreamIsCapturing")));
            return 0;
        }
    }
    return -1;
}

UVM_EXPORT void uvmgate_set_block_shift(int shift) { g_shift.store(shift); }

// The mover: blocks (block numbers, address >> shift) now have `state`, with `event` (a cudaEvent_t, 0 for
// none) for the in-flight states.
UVM_EXPORT void uvmgate_set(const uint64_t* blocks, size_t n, uint64_t event, uint32_t state) {
    const uint64_t v = (event & ~uint64_t(7)) | (state & 7);
    for (size_t i = 0; i < n; ++i) {
        Slot* s = find(blocks[i], true);
        if (s == nullptr) continue;
        s->val.store(v, std::memory_order_release);
        s->key.store(blocks[i] + 1, std::memory_order_release);
    }
}

// The mover: the move with `event` finished; blocks still pointing at it get `state` (resident / on host).
UVM_EXPORT void uvmgate_settle(const uint64_t* blocks, size_t n, uint64_t event, uint32_t state) {
    for (size_t i = 0; i < n; ++i) {
        Slot* s = find(blocks[i], false);
        if (s == nullptr) continue;
        uint64_t v = s->val.load(std::memory_order_relaxed);
        if ((v & ~uint64_t(7)) == (event & ~uint64_t(7)))
            s->val.compare_exchange_strong(v, state & 7, std::memory_order_release);
    }
}

UVM_EXPORT void uvmgate_get(const uint64_t* blocks, size_t n, uint64_t* out) {
    for (size_t i = 0; i < n; ++i) {
        Slot* s = find(blocks[i], false);
        out[i] = s ? s->val.load(std::memory_order_acquire) : 0;
    }
}

// The mover: up to `max` demanded block numbers (copy-ins ops wait for), oldest first; returns how many.
UVM_EXPORT size_t uvmgate_take_demands(uint64_t* out, size_t max) {
    size_t n = 0;
    uint64_t tail = g_demand_tail.load(std::memory_order_relaxed);
    const uint64_t head = g_demand_head.load(std::memory_order_acquire);
    while (tail < head && n < max) {
        const uint64_t b = g_demand[tail % kDemands].exchange(0, std::memory_order_acq_rel);
        if (b == 0) break;  // reserved, not written yet
        out[n++] = b - 1;
        ++tail;
        g_demand_tail.store(tail, std::memory_order_release);
    }
    return n;
}

// Let waiting ops release the GIL (the mover is a Python thread): resolve the three C-API calls in this process.
// Returns 1 when found (a Python process), 0 otherwise (ops then wait holding nothing: no Python to starve).
UVM_EXPORT int uvmgate_use_gil() {
    auto check = reinterpret_cast<GilCheckFn>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    auto save = reinterpret_cast<SaveFn>(dlsym(RTLD_DEFAULT, "PyEval_SaveThread"));
    auto restore = reinterpret_cast<RestoreFn>(dlsym(RTLD_DEFAULT, "PyEval_RestoreThread"));
    if (!check || !save || !restore) return 0;
    g_gil_check.store(check);
    g_gil_save.store(save);
    g_gil_restore.store(restore);
    return 1;
}

// The mover, after marking blocks kMirrored: wait until every op that was past its gate check has reached its end
// callback (its kernels are queued). Returns 0; -1 after `timeout_ms`, or when more threads ran ops than are
// counted (then the caller must not rely on it).
UVM_EXPORT int uvmgate_quiesce(int timeout_ms) {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the marks are visible before the counts are read
    const size_t n = g_nthreads.load(std::memory_order_seq_cst);
    if (n > kThreads) return -1;
    uint64_t snap[kThreads];
    for (size_t i = 0; i < n; ++i) snap[i] = g_ops[i].in.load(std::memory_order_seq_cst);
    const auto t_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    const timespec pause{0, 20000};
    for (size_t i = 0; i < n; ++i) {
        while (g_ops[i].out.load(std::memory_order_acquire) < snap[i]) {
            if (std::chrono::steady_clock::now() > t_end) return -1;
            nanosleep(&pause, nullptr);
        }
    }
    return 0;
}

// [blocks demanded by ops, ns ops spent waiting for copy-ins to be queued]
UVM_EXPORT void uvmgate_demand_counters(uint64_t* out) {
    out[0] = g_demanded.load();
    out[1] = g_demand_wait_ns.load();
}

// An op's start and end callbacks apart (tests): the gate check, then later its end.
UVM_EXPORT void uvmgate_begin(const uint64_t* starts, const uint64_t* lengths, size_t n, void* stream, uint32_t* out) {
    uvm::GateResult r;
    uvm::gate_check(starts, lengths, n, stream, r);
    out[0] = r.late;
    out[1] = r.fault;
    out[2] = r.waits;
}
UVM_EXPORT void uvmgate_end() { uvm::gate_op_end(); }

// counters: [blocks known, table-full refusals, cudaStreamWaitEvent errors, wait function found,
//            progress marks skipped]
UVM_EXPORT void uvmgate_counters(uint64_t* out) {
    out[0] = g_used.load();
    out[1] = g_full.load();
    out[2] = g_wait_errors.load();
    out[3] = g_wait.load() != nullptr;
    out[4] = g_marks_dropped.load();
}

// What the observer's callback does for an op touching these ranges, callable without torch (tests).
UVM_EXPORT void uvmgate_check(const uint64_t* starts, const uint64_t* lengths, size_t n, void* stream,
                              uint32_t* out) {
    uvm::GateResult r;
    uvm::gate_check(starts, lengths, n, stream, r);
    uvm::gate_op_end();
    out[0] = r.late;
    out[1] = r.fault;
    out[2] = r.waits;
}
