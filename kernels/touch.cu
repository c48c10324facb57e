// Touch kernels for the GPU trace replay (bench/gpu/replay_gpu.py): one launch per recorded launch.
//
// A launch reads and/or writes exactly its byte ranges, given as chunks of at most 1 MiB in a table in device
// memory (bench/gpu/_replay_core.py `touch_plan`: the launch's accesses made disjoint, each byte with the union of
// the modes that name it), then spins until its recorded duration has passed, so that the GPU's time matches
// the trace's and a launch whose data must first come over the link (a fault) takes longer by that much.
//
// Compiled at run time by CuPy (NVRTC), no headers. The grid is at most two CTAs of 256 threads per SM, so every
// CTA is resident from the start and each spins from its own start to the same deadline: the kernel lasts
// max(its duration, the time its slowest CTA spent touching).
//
// Per chunk: the 16-byte-aligned middle in uint4 loads/stores, the unaligned head and tail byte by byte (a chunk
// shorter than 16 bytes is all head). Reads are folded into a value that is stored only if it hits a 64-bit
// constant, so the compiler keeps them. Writes store `stamp` (the launch index, low 8 bits) in every byte.
// uvmp_touch_count does the same and adds 1 to counts[byte - count_base] for every byte it visits (the GPU
// self-test: every byte of every chunk exactly once).

struct Chunk {
    unsigned long long addr;  // absolute address of the first byte
    unsigned int len;         // bytes, 1 .. 1 MiB
    unsigned int mode;        // 1 = read, 2 = write, 3 = read then write
};

__device__ __forceinline__ unsigned long long uvmp_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

template <bool COUNT>
__device__ __forceinline__ void uvmp_bytes(unsigned char* p, unsigned long long n, unsigned int mode,
                                           unsigned char stamp, unsigned long long& acc,
                                           unsigned int* counts, unsigned long long count_base) {
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
        if (mode & 1u) acc = acc * 31u + p[i];
        if (mode & 2u) p[i] = stamp;
        if (COUNT) atomicAdd(&counts[(unsigned long long)(p + i) - count_base], 1u);
    }
}

template <bool COUNT>
__device__ void uvmp_touch_impl(const Chunk* table, unsigned long long first, unsigned int n,
                                unsigned long long spin_ns, unsigned int stamp, unsigned long long sink,
                                unsigned int* counts, unsigned long long count_base) {
    __shared__ unsigned long long t0;
    if (threadIdx.x == 0) t0 = uvmp_now_ns();
    __syncthreads();
    const unsigned char s8 = (unsigned char)(stamp & 0xffu);
    const unsigned int s32 = 0x01010101u * s8;
    const uint4 w = make_uint4(s32, s32, s32, s32);
    unsigned long long acc = 0;
    for (unsigned int c = blockIdx.x; c < n; c += gridDim.x) {
        const Chunk ch = table[first + c];
        const unsigned long long lo = ch.addr, hi = ch.addr + ch.len;
        unsigned long long a16 = (lo + 15ull) & ~15ull, b16 = hi & ~15ull;
        if (b16 <= a16) a16 = b16 = hi;  // no aligned word inside: all head
        uvmp_bytes<COUNT>((unsigned char*)lo, a16 - lo, ch.mode, s8, acc, counts, count_base);
        uint4* q = (uint4*)a16;
        const unsigned long long nw = (b16 - a16) >> 4;
        for (unsigned long long i = threadIdx.x; i < nw; i += blockDim.x) {
            if (ch.mode & 1u) {
                const uint4 v = q[i];
                acc = acc * 31u + ((unsigned long long)(v.x ^ v.y) << 32 | (v.z ^ v.w));
            }
            if (ch.mode & 2u) q[i] = w;
            if (COUNT) {
                unsigned int* c0 = &counts[(unsigned long long)(q + i) - count_base];
                for (int k = 0; k < 16; ++k) atomicAdd(c0 + k, 1u);
            }
        }
        uvmp_bytes<COUNT>((unsigned char*)b16, hi - b16, ch.mode, s8, acc, counts, count_base);
    }
    if (acc == 0x9e3779b97f4a7c15ull) *(unsigned long long*)sink = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        while (uvmp_now_ns() - t0 < spin_ns) {
        }
    }
}

// Addresses travel as 64-bit integers: the launcher (CuPy) passes NumPy scalars and knows no pointer types.
extern "C" __global__ void uvmp_touch(unsigned long long table, unsigned long long first, unsigned int n,
                                      unsigned long long spin_ns, unsigned int stamp, unsigned long long sink) {
    uvmp_touch_impl<false>((const Chunk*)table, first, n, spin_ns, stamp, sink, nullptr, 0ull);
}

extern "C" __global__ void uvmp_touch_count(unsigned long long table, unsigned long long first, unsigned int n,
                                            unsigned long long spin_ns, unsigned int stamp, unsigned long long sink,
                                            unsigned long long counts, unsigned long long count_base) {
    uvmp_touch_impl<true>((const Chunk*)table, first, n, spin_ns, stamp, sink, (unsigned int*)counts, count_base);
}
