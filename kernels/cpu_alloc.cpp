// cpu_alloc.cpp: the CPU allocator's event source, for the dryrun backend (where CPU tensors stand for GPU
// ones). It wraps c10's CPU allocator (c10::SetCPUAllocator with a priority above the default's), forwards
// every allocation to the allocator it replaced, and reports ALLOC / FREE_COMPLETED as uvm::AllocEvent records
// (device -1) into a ring of their own: the same record the CUDA caching allocator's trace tracker produces on
// a GPU, so the planner learns tensor deaths the same way on both (no Python finalizers). It also keeps the
// live bytes, which is how the planner knows, for nothing, whether anything is under pressure at all.
//
// The data pointers it hands out stay "simple" (context == data) whenever the wrapped allocator's are, with a
// deleter that reports and then calls the wrapped allocator's raw deleter, so raw_allocate / raw_deleter
// users and copy-on-write storages keep working; otherwise the original DataPtr travels in a context.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <pthread.h>
#include <mutex>
#include <unordered_map>

#include "uvmevents.h"
#include "uvmobs.h"
#include "uvmring.h"

#define UVM_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

uvm::Ring<uvm::AllocEvent, 16> g_ring;  // 65536 events
std::atomic<bool> g_events{false};
std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<uint64_t> g_nalloc{0}, g_nfree{0};
std::atomic<uint64_t> g_threshold{~uint64_t(0)};
std::atomic<bool> g_pressure{false};
std::mutex g_wait_mu;
std::condition_variable g_wait_cv;

c10::Allocator* g_prev = nullptr;
c10::DeleterFnPtr g_prev_raw = nullptr;
constexpr uint8_t kPriority = 1;  // above c10's default CPU allocator (0)

// addr -> size of live allocations (for the live bytes and FREE events), sharded to keep threads apart.
struct Shard {
    std::mutex mu;
    std::unordered_map<uintptr_t, size_t> sizes;
};
Shard g_shards[32];
Shard& shard(const void* p) { return g_shards[(reinterpret_cast<uintptr_t>(p) >> 6) % 32]; }

void push(uint32_t action, const void* p, size_t n) {
    if (!g_events.load(std::memory_order_relaxed)) return;
    uvm::AllocEvent e{uvm::next_seq(), reinterpret_cast<uintptr_t>(p), n, 0, action, -1};
    g_ring.push(e);
}

void note_alloc(void* p, size_t n) {
    {
        Shard& s = shard(p);
        std::lock_guard<std::mutex> lk(s.mu);
        s.sizes[reinterpret_cast<uintptr_t>(p)] = n;
    }
    g_nalloc.fetch_add(1, std::memory_order_relaxed);
    const int64_t live = g_live.fetch_add(int64_t(n), std::memory_order_relaxed) + int64_t(n);
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    push(uvm::kAlloc, p, n);
    if (uint64_t(live) >= g_threshold.load(std::memory_order_relaxed) && !g_pressure.exchange(true)) {
        std::lock_guard<std::mutex> lk(g_wait_mu);  // (with the waiter's lock: no lost wake-up)
        g_wait_cv.notify_all();
    }
}

void note_free(void* p) {
    size_t n = 0;
    {
        Shard& s = shard(p);
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.sizes.find(reinterpret_cast<uintptr_t>(p));
        if (it != s.sizes.end()) {
            n = it->second;
            s.sizes.erase(it);
        }
    }
    g_nfree.fetch_add(1, std::memory_order_relaxed);
    g_live.fetch_sub(int64_t(n), std::memory_order_relaxed);
    push(uvm::kFreeCompleted, p, n);
}

void delete_simple(void* p) {
    note_free(p);
    g_prev_raw(p);
}

struct Wrapped {
    c10::DataPtr inner;
};

void delete_wrapped(void* ctx) {
    auto* w = static_cast<Wrapped*>(ctx);
    note_free(w->inner.get());
    delete w;  // the inner DataPtr's own deleter runs here
}

class EventAllocator final : public c10::Allocator {
public:
    c10::DataPtr allocate(size_t n) override {
        c10::DataPtr inner = g_prev->allocate(n);
        void* data = inner.get();
        if (data == nullptr) return inner;
        note_alloc(data, n);
        const c10::Device dev = inner.device();
        if (g_prev_raw != nullptr && inner.get_context() == data && inner.get_deleter() == g_prev_raw) {
            inner.release_context();  // freed by delete_simple from now on
            return {data, data, &delete_simple, dev};
        }
        auto* w = new Wrapped{std::move(inner)};
        return {data, w, &delete_wrapped, dev};
    }
    c10::DeleterFnPtr raw_deleter() const override { return g_prev_raw ? &delete_simple : nullptr; }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
        g_prev->copy_data(dest, src, count);
    }
};

EventAllocator g_alloc;
std::mutex g_install_mu;

// fork() (DataLoader workers) while another thread holds a shard's lock would leave it locked in the child
// forever: every shard is taken around the fork and given back on both sides.
void fork_prepare() {
    for (auto& sh : g_shards) sh.mu.lock();
}
void fork_done() {
    for (auto& sh : g_shards) sh.mu.unlock();
}

}  // namespace

namespace uvm {
uint64_t alloc_live_bytes() { return uint64_t(std::max<int64_t>(0, g_live.load(std::memory_order_relaxed))); }
}  // namespace uvm

// Put the wrapper in front of c10's CPU allocator. 0: installed (or already); -1: another allocator with a
// higher priority holds the slot (events cannot be seen); -2: an error (no CPU allocator).
UVM_EXPORT int uvmalloc_install() {
    std::lock_guard<std::mutex> lk(g_install_mu);
    try {
        c10::Allocator* cur = c10::GetCPUAllocator();
        if (cur == &g_alloc) return 0;
        if (cur == nullptr) return -2;
        g_prev = cur;
        g_prev_raw = cur->raw_deleter();
        static const int forked = pthread_atfork(&fork_prepare, &fork_done, &fork_done);
        (void)forked;
        c10::SetCPUAllocator(&g_alloc, kPriority);
        return c10::GetCPUAllocator() == &g_alloc ? 0 : -1;
    } catch (...) {
        return -2;
    }
}

// Give the slot back to the allocator it replaced (storages it handed out still report their frees).
UVM_EXPORT void uvmalloc_uninstall() {
    std::lock_guard<std::mutex> lk(g_install_mu);
    try {
        if (g_prev != nullptr && c10::GetCPUAllocator() == &g_alloc) c10::SetCPUAllocator(g_prev, kPriority);
    } catch (...) {
    }
}

UVM_EXPORT void uvmalloc_set_events(int on) { g_events.store(on != 0); }

UVM_EXPORT size_t uvmalloc_drain(uvm::AllocEvent* out, size_t max) { return g_ring.drain(out, max); }

// [live bytes, peak live bytes, allocations, frees, dropped events]
UVM_EXPORT void uvmalloc_stats(uint64_t* out) {
    out[0] = uvm::alloc_live_bytes();
    out[1] = uint64_t(std::max<int64_t>(0, g_peak.load()));
    out[2] = g_nalloc.load();
    out[3] = g_nfree.load();
    out[4] = g_ring.dropped();
}

// Block (the caller releases the GIL) until the live bytes reach `threshold`, `timeout_ms` passes, or
// uvmalloc_wake is called. Returns 1 when the live bytes are at or above the threshold.
UVM_EXPORT int uvmalloc_wait_pressure(uint64_t threshold, int timeout_ms) {
    g_threshold.store(threshold);
    g_pressure.store(uvm::alloc_live_bytes() >= threshold);
    std::unique_lock<std::mutex> lk(g_wait_mu);
    g_wait_cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return g_pressure.load(); });
    return uvm::alloc_live_bytes() >= threshold ? 1 : 0;
}

UVM_EXPORT void uvmalloc_wake() {
    g_pressure.store(true);
    std::lock_guard<std::mutex> lk(g_wait_mu);
    g_wait_cv.notify_all();
}
