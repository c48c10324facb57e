// uvmevents.h: the allocator event record, shared by the two sources of allocation events:
// - on a GPU, PyTorch's CUDA caching allocator through `attachAllocatorTraceTracker` (alloc_tracker.cpp);
// - on a CPU (the dryrun backend), a wrapper around c10's CPU allocator that reports the same way.
// Both push into a `uvm::Ring<AllocEvent, ...>` (uvmring.h); the planner reads them as a NumPy structured
// array (`uvmprefetch.runtime.liveness.EVENT_DTYPE` mirrors this layout field for field: change both).
#pragma once

#include <cstdint>

namespace uvm {

// The caching allocator's actions (c10::cuda::CUDACachingAllocator::TraceEntry::Action), renumbered here so
// that the record does not depend on the order of that enum in a given torch version.
enum AllocAction : uint32_t {
    kAlloc = 0,           // a block handed to a caller: [addr, addr+size) is live from now
    kFreeRequested = 1,   // the caller freed it, but the stream uses recorded on it may still run
    kFreeCompleted = 2,   // every stream use has finished: the bytes are dead (and may be reused)
    kSegmentAlloc = 3,    // the allocator got a new segment from the driver (cudaMalloc)
    kSegmentFree = 4,     // a segment went back to the driver (cudaFree, empty_cache)
    kSegmentMap = 5,      // expandable segments: pages mapped into a reserved range
    kSegmentUnmap = 6,    // expandable segments: pages unmapped
    kSnapshot = 7,        // a memory snapshot was taken (no memory changes)
    kOom = 8,             // the allocator failed an allocation
    kAnnotate = 9,        // metadata attached to a live allocation (torch >= 2.14; no memory changes)
    kUnknown = 15,        // an action this build does not know (treat everything as live until quiescent)
};

// Flag bits above the action's low byte (``action & 0xFF`` is the AllocAction).
enum AllocFlag : uint32_t {
    kPrivatePool = 1u << 8,  // the memory belongs to a private pool (a CUDA graph's, a torch.cuda.MemPool's)
};

struct AllocEvent {
    uint64_t seq;     // uvm::next_seq(): the order among all observed ops and allocator events
    uint64_t addr;    // first byte
    uint64_t size;    // bytes
    uint64_t stream;  // the CUDA stream (cudaStream_t as an integer); 0 on the CPU
    uint32_t action;  // AllocAction | AllocFlag bits
    int32_t device;   // CUDA device index; -1 on the CPU
};
static_assert(sizeof(AllocEvent) == 40, "AllocEvent is mirrored by a NumPy dtype: keep it at 40 bytes");

}  // namespace uvm
