// alloc_tracker.cpp: PyTorch's CUDA caching allocator reports every change of its books to the planner.
//
// `c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker` calls a function for each TraceEntry (ALLOC,
// FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC/FREE/MAP/UNMAP, ...) on whatever thread allocates, while that
// device's allocator lock is held, whether or not memory history is recorded. The function here only turns
// the entry into a `uvm::AllocEvent` (uvmevents.h) and pushes it into a lock-free ring (uvmring.h): no
// allocation, no lock, no GIL, no CUDA call. The planner drains the ring through the C entry points below
// (ctypes, GIL released) into `uvmprefetch.runtime.liveness.Liveness`.
//
// Build (C++20: torch 2.14's headers need it; against the installed torch's headers and libc10_cuda.so and the
// CUDA runtime headers; no nvcc), as tests/unit/test_alloc_tracker_native.py does:
//   g++ -std=c++20 -O2 -DNDEBUG -fPIC -shared -D_GLIBCXX_USE_CXX11_ABI=<torch's>
//       -DUVM_TORCH_VERSION='"<torch.__version__>"' -isystem <torch>/include -isystem <cuda>/include -Ikernels
//       kernels/alloc_tracker.cpp -L<torch>/lib -lc10_cuda -lc10 -Wl,-rpath,<torch>/lib -Wl,--no-undefined
//       -o libuvmalloc.so
// To share `uvm::next_seq()` with the C++ observer (issue #31), compile it into the same shared library.
//
// What differs between torch versions (checked in their headers: 2.9.1, 2.11.0, 2.13.0, 2.14.1):
// - where TraceEntry lives: its own struct in c10/cuda/CUDACachingAllocator.h (2.9), or
//   c10::CachingDeviceAllocator::TraceEntry in c10/core/CachingDeviceAllocator.h, re-exported into
//   c10::cuda::CUDACachingAllocator by a using-declaration (2.11, 2.13, 2.14): the name used below works for all;
// - `stream_`: cudaStream_t (2.9) or void* (2.11+): both are pointers, read as an integer;
// - `addr_`/`size_`: size_t (2.9+; int64_t in older releases), `device_`: c10::DeviceIndex;
// - `mempool_` (private pools: CUDA graphs, torch.cuda.MemPool): present in all four; detected, and attach
//   refuses a torch without it (private-pool memory could not be told apart, and must never be discarded);
// - the Action enum: ALLOC .. OOM in the same order in all four, ANNOTATE added in 2.14 (detected). An action
//   not named here becomes kUnknown, which makes the planner treat every block as live until it resyncs.
// The signature `void attachAllocatorTraceTracker(std::function<void(const TraceEntry&)>)` is the same in all.

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "uvmevents.h"
#include "uvmring.h"

#ifndef UVM_TORCH_VERSION
#define UVM_TORCH_VERSION "unknown"
#endif

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
using Entry = cca::TraceEntry;

// 2^17 records (~6 MiB): GPT-2 large makes ~12 000 allocator events an iteration; the planner drains far more
// often than that, so the ring overflows only when the planner stalls.
constexpr size_t kLogCapacity = 17;
using EventRing = uvm::Ring<uvm::AllocEvent, kLogCapacity>;

EventRing& ring() {
    static EventRing r;  // constructed on first use (attach), before the tracker can push
    return r;
}

std::atomic<bool> g_enabled{false};
std::atomic<bool> g_attached{false};
std::atomic<uint64_t> g_seen{0};
std::atomic<uint64_t> g_last_dropped_seq{0};
std::atomic<int64_t> g_inflight{0};  // callbacks between numbering their event and pushing it
char g_error[512] = "";

void set_error(const char* what, const char* detail) {
    std::snprintf(g_error, sizeof(g_error), "%s%s%s", what, detail[0] ? ": " : "", detail);
}

// ---------------------------------------------------------------------------------- layout differences

template <class T, class = void>
struct HasMempool : std::false_type {};
template <class T>
struct HasMempool<T, std::void_t<decltype(std::declval<const T&>().mempool_)>> : std::true_type {};

template <class T, class = void>
struct HasAnnotate : std::false_type {};
template <class T>
struct HasAnnotate<T, std::void_t<decltype(T::ANNOTATE)>> : std::true_type {};

template <class T>
uint32_t action_of(const T& e) {
    switch (e.action_) {
        case T::ALLOC: return uvm::kAlloc;
        case T::FREE_REQUESTED: return uvm::kFreeRequested;
        case T::FREE_COMPLETED: return uvm::kFreeCompleted;
        case T::SEGMENT_ALLOC: return uvm::kSegmentAlloc;
        case T::SEGMENT_FREE: return uvm::kSegmentFree;
        case T::SEGMENT_MAP: return uvm::kSegmentMap;
        case T::SEGMENT_UNMAP: return uvm::kSegmentUnmap;
        case T::SNAPSHOT: return uvm::kSnapshot;
        case T::OOM: return uvm::kOom;
        default: break;
    }
    if constexpr (HasAnnotate<T>::value) {
        if (e.action_ == T::ANNOTATE) return uvm::kAnnotate;
    }
    return uvm::kUnknown;
}

template <class T>
uint32_t pool_flag(const T& e) {
    if constexpr (HasMempool<T>::value) {
        return (e.mempool_.first != 0 || e.mempool_.second != 0) ? uint32_t(uvm::kPrivatePool) : 0u;
    } else {
        return 0u;
    }
}

// ---------------------------------------------------------------------------------- the callback

// Runs under the device's allocator lock, on any thread: fills one record and pushes it. A full ring drops it
// and remembers the largest dropped sequence number (events after it are known to follow every drop).
void on_trace(const Entry& e) noexcept {
    if (!g_enabled.load(std::memory_order_relaxed)) return;
    g_inflight.fetch_add(1);  // (seq_cst: before the number is taken, so uvm_alloc_tracker_quiesce sees it)
    uvm::AllocEvent ev;
    ev.seq = uvm::seq_counter().fetch_add(1, std::memory_order_seq_cst);  // (ordered after the count above)
    ev.addr = static_cast<uint64_t>(e.addr_);
    ev.size = static_cast<uint64_t>(e.size_);
    ev.stream = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(e.stream_));
    ev.action = action_of(e) | pool_flag(e);
    ev.device = static_cast<int32_t>(e.device_);
    g_seen.fetch_add(1, std::memory_order_relaxed);
    if (!ring().push(ev)) {
        uint64_t prev = g_last_dropped_seq.load(std::memory_order_relaxed);
        while (prev < ev.seq &&
               !g_last_dropped_seq.compare_exchange_weak(prev, ev.seq, std::memory_order_relaxed)) {
        }
    }
    g_inflight.fetch_sub(1);
}

}  // namespace

// ---------------------------------------------------------------------------------- C entry points

extern "C" {

// Attach the tracker to the caching allocator (once per process: torch has no detach; later calls only
// re-enable it). Call after CUDA's lazy initialisation (the allocator attaches to the device allocators that
// exist) and before the first allocation, or resync the planner with a snapshot. 0 on success, -1 with
// uvm_alloc_tracker_error() saying why.
int uvm_alloc_tracker_attach(void) {
    if (g_attached.load()) {
        g_enabled.store(true);
        return 0;
    }
    if (!HasMempool<Entry>::value) {
        set_error("this torch's TraceEntry has no mempool_", "private-pool memory cannot be told apart");
        return -1;
    }
    try {
        cca::CUDAAllocator* a = cca::get();
        if (a == nullptr) {
            set_error("no CUDA allocator", "");
            return -1;
        }
        if (!a->initialized()) {
            set_error("the CUDA caching allocator is not initialised", "attach after torch.cuda.init()");
            return -1;
        }
        const std::string name = a->name();
        if (name != "native") {
            set_error("the CUDA allocator is not the caching allocator", name.c_str());
            return -1;
        }
        (void)ring();  // construct the ring before the first callback can run
        g_enabled.store(true);
        cca::attachAllocatorTraceTracker([](const Entry& e) { on_trace(e); });
        g_attached.store(true);
        return 0;
    } catch (const std::exception& ex) {
        g_enabled.store(false);
        set_error("attachAllocatorTraceTracker failed", ex.what());
        return -1;
    } catch (...) {
        g_enabled.store(false);
        set_error("attachAllocatorTraceTracker failed", "unknown exception");
        return -1;
    }
}

// Stop (0) or resume (1) pushing; the allocator keeps calling the (then empty) callback.
void uvm_alloc_tracker_enable(int on) { g_enabled.store(on != 0); }

// Copy up to `max` records, in ring order, into `out`; returns how many (the planner's thread only).
size_t uvm_alloc_tracker_drain(uvm::AllocEvent* out, size_t max) { return ring().drain(out, max); }

// Records dropped because the ring was full, since the start; `*last_seq` (if given) gets the largest
// sequence number among them (0: none).
uint64_t uvm_alloc_tracker_dropped(uint64_t* last_seq) {
    if (last_seq != nullptr) *last_seq = g_last_dropped_seq.load(std::memory_order_relaxed);
    return ring().dropped();
}

// Allocator events seen by the callback while enabled (pushed or dropped).
uint64_t uvm_alloc_tracker_seen(void) { return g_seen.load(std::memory_order_relaxed); }

// A fresh number of the process-wide sequence: an ordering point between allocator events and other work.
uint64_t uvm_alloc_tracker_next_seq(void) { return uvm::next_seq(); }

// Take and release `device`'s allocator lock (through getDeviceStats): when it returns, every event of that
// device numbered before the call has been pushed (or dropped). 0, or -1 with uvm_alloc_tracker_error().
int uvm_alloc_tracker_barrier(int device) {
    try {
        (void)cca::getDeviceStats(static_cast<c10::DeviceIndex>(device));
        return 0;
    } catch (const std::exception& ex) {
        set_error("getDeviceStats failed", ex.what());
        return -1;
    } catch (...) {
        set_error("getDeviceStats failed", "unknown exception");
        return -1;
    }
}

// Wait, without any lock, until every event numbered before the call is pushed (or dropped): a callback
// counts itself in flight before it numbers its event, so once the count is seen at zero after this call's own
// number was taken, every earlier-numbered event is in the ring. Unlike the barrier it never waits for the
// allocator's lock, which a thread may hold while it waits for the GPU (an event synchronize when the allocator
// frees cached blocks) -- and the GPU may be waiting for the caller (the discard gate). 0, or -1 when the count
// did not reach zero within `timeout_us` microseconds (the caller then knows nothing new).
int uvm_alloc_tracker_quiesce(int timeout_us) {
    (void)uvm::seq_counter().fetch_add(1, std::memory_order_seq_cst);
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(timeout_us);
    for (int spin = 0;; ++spin) {
        if (g_inflight.load() == 0) return 0;
        if ((spin & 63) == 63) {
            if (std::chrono::steady_clock::now() > until) return -1;
            std::this_thread::yield();
        }
    }
}

const char* uvm_alloc_tracker_error(void) { return g_error; }

// The torch version this library was compiled against.
const char* uvm_alloc_tracker_built_for(void) { return UVM_TORCH_VERSION; }

size_t uvm_alloc_tracker_record_size(void) { return sizeof(uvm::AllocEvent); }

size_t uvm_alloc_tracker_capacity(void) { return EventRing::kCapacity; }

}  // extern "C"
