// Prints uvm::AllocEvent's layout and the action numbers, for tests/unit/test_alloc_tracker_native.py to
// compare with uvmprefetch.runtime.liveness (EVENT_DTYPE and the action constants).
#include <cstddef>
#include <cstdio>

#include "uvmevents.h"

int main() {
    using uvm::AllocEvent;
    std::printf("itemsize %zu\n", sizeof(AllocEvent));
    std::printf("seq %zu %zu\n", offsetof(AllocEvent, seq), sizeof(AllocEvent::seq));
    std::printf("addr %zu %zu\n", offsetof(AllocEvent, addr), sizeof(AllocEvent::addr));
    std::printf("size %zu %zu\n", offsetof(AllocEvent, size), sizeof(AllocEvent::size));
    std::printf("stream %zu %zu\n", offsetof(AllocEvent, stream), sizeof(AllocEvent::stream));
    std::printf("action %zu %zu\n", offsetof(AllocEvent, action), sizeof(AllocEvent::action));
    std::printf("device %zu %zu\n", offsetof(AllocEvent, device), sizeof(AllocEvent::device));
    std::printf("ALLOC %u\nFREE_REQUESTED %u\nFREE_COMPLETED %u\nSEGMENT_ALLOC %u\nSEGMENT_FREE %u\n",
                uvm::kAlloc, uvm::kFreeRequested, uvm::kFreeCompleted, uvm::kSegmentAlloc, uvm::kSegmentFree);
    std::printf("SEGMENT_MAP %u\nSEGMENT_UNMAP %u\nSNAPSHOT %u\nOOM %u\nANNOTATE %u\nUNKNOWN %u\n",
                uvm::kSegmentMap, uvm::kSegmentUnmap, uvm::kSnapshot, uvm::kOom, uvm::kAnnotate, uvm::kUnknown);
    std::printf("PRIVATE_POOL %u\n", uvm::kPrivatePool);
    return 0;
}
