// uvmobs.h: what the C++ observer (observer.cpp) hands the planner, and the pieces of libuvmobserver.so that
// call each other (the CPU allocator's event source, the pre-op gate).
//
// The op ring carries fixed 32-byte records. One observed op is one contiguous run, pushed when the op has
// returned (its outputs exist): a HEAD record, a HEAD2 record, then one RANGE record per distinct byte range it
// touched. Marks (optimizer steps, set from Python) are single records. The planner reads them as a NumPy
// array (uvmprefetch/runtime/native_observer.py mirrors this layout: change both).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace uvm {

// Record kinds, in the top byte of `c`.
enum RecKind : uint8_t { kHead = 1, kHead2 = 2, kRange = 3, kMark = 4, kGate = 5 };

// HEAD:  a = seq (uvm::next_seq() when the op returned), b = execution id,
//        c = op id (32 bits) | phase << 32 | GATE records << 40 | other thread << 48 | kHead << 56,
//        d = RANGE + GATE records (other thread: not the one that started the observer)
// HEAD2: a = FLOPs (double bits), b = bytes moved (each range once, twice when read and written),
//        c = flop dtype (0 fp32, 1 bf16, 2 fp16) | gate flags << 8 | kHead2 << 56,
//        d = late blocks (32 bits: in flight when the op was issued) | fault blocks << 32 (neither resident nor
//            in flight: they will fault)
// RANGE: a = storage base address, b = byte offset in the storage, c = length (48 bits) | mode << 48 |
//        range flags << 52 | kRange << 56, d = storage bytes
// GATE:  (after the ranges, CUDA only, when the gate saw any) a = block number (address >> block shift),
//        b = 1 late / 2 fault, c = kGate << 56, d = 0
// MARK:  a = seq, b = value, c = code | kMark << 56, d = 0
struct OpRec {
    uint64_t a, b, c, d;
};
static_assert(sizeof(OpRec) == 32, "OpRec is mirrored by a NumPy dtype: keep it at 32 bytes");

enum Phase : uint8_t { kForward = 0, kBackward = 1, kOptimizer = 2 };  // uvmprefetch.trace.format.PHASE order
enum Mode : uint8_t { kRead = 1, kWrite = 2 };                          // trace.format READ / WRITE
enum RangeFlag : uint8_t { kLeafGrad = 1 };                             // a leaf that requires grad (a parameter)
enum MarkCode : uint32_t { kOptimizerPre = 1, kOptimizerPost = 2 };

// Gate (gate.cpp): called by the observer before an op's kernels are queued, on the training thread.
struct GateResult {
    uint32_t late = 0;    // blocks whose move to the GPU was in flight (the op's stream now waits for it)
    uint32_t fault = 0;   // blocks neither resident nor on their way (they will fault)
    uint32_t waits = 0;   // cudaStreamWaitEvent calls made
    static constexpr size_t kListMax = 64;  // blocks listed per op and kind (the counts stay exact)
    uint64_t late_blocks[kListMax], fault_blocks[kListMax];
};
bool gate_armed();  // any block state known at all (else the gate costs one atomic load)
void gate_check(const uint64_t* starts, const uint64_t* lengths, size_t n, void* stream, GateResult& out);
void gate_op_end();  // the op gate_check passed has queued its kernels (its end callback)

bool stream_capturing(void* stream);               // cudaStreamIsCapturing: ops in a graph capture are not planned
void progress_note(uint64_t seq, void* stream);    // every k-th op: an event after its kernels (GPU progress)

// CPU allocator events (cpu_alloc.cpp): live bytes for the planner's "is there pressure?" question.
uint64_t alloc_live_bytes();

}  // namespace uvm
