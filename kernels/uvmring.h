// uvmring.h: the bounded, lock-free, multi-producer single-consumer ring that carries records from the
// threads that observe (training and autograd threads in the RecordFunction callback, any thread holding
// the caching allocator's lock in the trace tracker) to the one thread that plans (the planner, through a
// C-ABI drain call made from ctypes with the GIL released).
//
// Why this shape:
// - Producers never block, allocate, take a lock or call CUDA: a full ring drops the record and counts it
//   (`dropped()`); the consumer sees the count change and treats the gap as unknown (no discard across it).
// - A producer may reserve several consecutive slots at once (`push`), so one op's header and its range
//   records stay contiguous even when two threads publish at the same time.
// - Every record carries a number from one process-wide sequence (`next_seq()`), shared by all rings, so the
//   planner can merge the observer's ops and the allocator's events into the order in which they happened.
//
// The algorithm is Dmitry Vyukov's bounded queue (each cell carries a sequence number that says whose turn
// it is) with multi-slot reservation on the producer side. With a single consumer that frees cells in order,
// "the last of the n cells is free" implies the n-1 before it are free too, so one check and one CAS reserve
// a run of n cells.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace uvm {

// The process-wide sequence: one per shared library (an inline function's static is unique across the
// translation units of one .so). Starts at 1; 0 means "no record".
inline std::atomic<uint64_t>& seq_counter() {
    static std::atomic<uint64_t> counter{1};
    return counter;
}

inline uint64_t next_seq(uint64_t n = 1) { return seq_counter().fetch_add(n, std::memory_order_relaxed); }

template <class T, size_t LogCapacity>
class Ring {
    static_assert(std::is_trivially_copyable<T>::value, "ring records are plain bytes");
    static_assert(LogCapacity >= 4 && LogCapacity <= 28, "capacity between 16 and 2^28 records");

public:
    static constexpr size_t kCapacity = size_t(1) << LogCapacity;
    static constexpr size_t kMask = kCapacity - 1;

    Ring() {
        for (size_t i = 0; i < kCapacity; ++i) cells_[i].turn.store(i, std::memory_order_relaxed);
    }
    Ring(const Ring&) = delete;
    Ring& operator=(const Ring&) = delete;

    // Publish `n` records as one contiguous run. Returns false (and counts `n` dropped records) when the
    // ring has no room for all of them; never waits for the consumer.
    bool push(const T* recs, size_t n) {
        if (n == 0) return true;
        if (n > kCapacity) {
            dropped_.fetch_add(n, std::memory_order_relaxed);
            return false;
        }
        size_t pos = head_.load(std::memory_order_relaxed);
        for (;;) {
            // the last cell of the run must be free in the lap `pos` is in
            const size_t last = pos + n - 1;
            const size_t turn = cells_[last & kMask].turn.load(std::memory_order_acquire);
            const intptr_t diff = intptr_t(turn) - intptr_t(last);
            if (diff == 0) {
                if (head_.compare_exchange_weak(pos, pos + n, std::memory_order_relaxed)) break;
            } else if (diff < 0) {  // not consumed yet: full
                dropped_.fetch_add(n, std::memory_order_relaxed);
                return false;
            } else {
                pos = head_.load(std::memory_order_relaxed);
            }
        }
        for (size_t i = 0; i < n; ++i) {
            Cell& c = cells_[(pos + i) & kMask];
            c.value = recs[i];
            c.turn.store(pos + i + 1, std::memory_order_release);
        }
        return true;
    }

    bool push(const T& rec) { return push(&rec, 1); }

    // Consumer side (one thread only): copy up to `max` published records, in order, into `out`. Stops at
    // the first cell a producer reserved but has not finished writing (it is picked up by the next call).
    size_t drain(T* out, size_t max) {
        size_t n = 0;
        size_t tail = tail_.load(std::memory_order_relaxed);
        while (n < max) {
            Cell& c = cells_[tail & kMask];
            if (c.turn.load(std::memory_order_acquire) != tail + 1) break;
            out[n++] = c.value;
            c.turn.store(tail + kCapacity, std::memory_order_release);
            ++tail;
        }
        tail_.store(tail, std::memory_order_relaxed);
        return n;
    }

    // Records refused because the ring was full, since the start.
    uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
    // Records published and not yet drained (approximate while producers run).
    size_t pending() const {
        return head_.load(std::memory_order_relaxed) - tail_.load(std::memory_order_relaxed);
    }

private:
    struct Cell {
        std::atomic<size_t> turn;
        T value;
    };
    alignas(64) std::atomic<size_t> head_{0};
    alignas(64) std::atomic<size_t> tail_{0};  // written by the consumer only
    alignas(64) std::atomic<uint64_t> dropped_{0};
    Cell cells_[kCapacity];
};

}  // namespace uvm
