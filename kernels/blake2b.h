// blake2b.h: BLAKE2b (RFC 7693), unkeyed, any digest size up to 64 bytes; what Python's
// hashlib.blake2b(data, digest_size=n) computes. The observer needs it for execution ids, which are
// blake2b-64 of "<op name>|<repr of the shape key>" (uvmprefetch.trace.format.exec_id_of): the C++ observer and
// the Python recorder must give the same id to the same op on the same shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace uvm {

class Blake2b {
public:
    explicit Blake2b(size_t outlen) : outlen_(outlen) {
        for (int i = 0; i < 8; ++i) h_[i] = kIV[i];
        h_[0] ^= 0x01010000u ^ uint64_t(outlen);  // depth 1, fanout 1, no key
    }

    void update(const void* data, size_t n) {
        const uint8_t* p = static_cast<const uint8_t*>(data);
        while (n > 0) {
            if (fill_ == 128) {  // the buffer is full and more data follows: compress it (not the last block)
                add_counter(128);
                compress(false);
                fill_ = 0;
            }
            size_t take = 128 - fill_;
            if (take > n) take = n;
            std::memcpy(buf_ + fill_, p, take);
            fill_ += take;
            p += take;
            n -= take;
        }
    }

    void final(uint8_t* out) {
        add_counter(fill_);
        std::memset(buf_ + fill_, 0, 128 - fill_);
        compress(true);
        for (size_t i = 0; i < outlen_; ++i) out[i] = uint8_t(h_[i >> 3] >> (8 * (i & 7)));
    }

private:
    static constexpr uint64_t kIV[8] = {0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
                                        0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
                                        0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
    static constexpr uint8_t kSigma[12][16] = {
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
        {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
        {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
        {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
        {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

    static uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

    void add_counter(size_t n) {
        t_[0] += n;
        if (t_[0] < n) ++t_[1];
    }

    void compress(bool last) {
        uint64_t m[16], v[16];
        for (int i = 0; i < 16; ++i) {
            uint64_t w = 0;
            for (int b = 7; b >= 0; --b) w = (w << 8) | buf_[8 * i + b];
            m[i] = w;
        }
        for (int i = 0; i < 8; ++i) {
            v[i] = h_[i];
            v[i + 8] = kIV[i];
        }
        v[12] ^= t_[0];
        v[13] ^= t_[1];
        if (last) v[14] = ~v[14];
        auto g = [&](int a, int b, int c, int d, uint64_t x, uint64_t y) {
            v[a] = v[a] + v[b] + x;
            v[d] = rotr(v[d] ^ v[a], 32);
            v[c] = v[c] + v[d];
            v[b] = rotr(v[b] ^ v[c], 24);
            v[a] = v[a] + v[b] + y;
            v[d] = rotr(v[d] ^ v[a], 16);
            v[c] = v[c] + v[d];
            v[b] = rotr(v[b] ^ v[c], 63);
        };
        for (int r = 0; r < 12; ++r) {
            const uint8_t* s = kSigma[r];
            g(0, 4, 8, 12, m[s[0]], m[s[1]]);
            g(1, 5, 9, 13, m[s[2]], m[s[3]]);
            g(2, 6, 10, 14, m[s[4]], m[s[5]]);
            g(3, 7, 11, 15, m[s[6]], m[s[7]]);
            g(0, 5, 10, 15, m[s[8]], m[s[9]]);
            g(1, 6, 11, 12, m[s[10]], m[s[11]]);
            g(2, 7, 8, 13, m[s[12]], m[s[13]]);
            g(3, 4, 9, 14, m[s[14]], m[s[15]]);
        }
        for (int i = 0; i < 8; ++i) h_[i] ^= v[i] ^ v[i + 8];
    }

    uint64_t h_[8];
    uint64_t t_[2] = {0, 0};
    uint8_t buf_[128] = {};
    size_t fill_ = 0;
    size_t outlen_;
};

// The first 8 bytes of blake2b-64 as a little-endian integer: Python's
// int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little").
inline uint64_t blake2b_64(const void* data, size_t n) {
    Blake2b h(8);
    h.update(data, n);
    uint8_t out[8];
    h.final(out);
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | out[i];
    return v;
}

}  // namespace uvm
