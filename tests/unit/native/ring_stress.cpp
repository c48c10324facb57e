// Stress harness for kernels/uvmring.h (tests/unit/test_uvmring.py compiles and runs it): four producers
// publish runs of 1-5 records each while one consumer drains; every drained run must be whole and in each
// producer's order, and every record a producer was told it published must be drained exactly once.
#include "uvmring.h"
#include <thread>
#include <vector>
#include <cstdio>
struct R { uint64_t seq, thread, i, k; };
int main() {
    static uvm::Ring<R, 10> ring;
    const int P = 4; const uint64_t N = 200000;
    std::atomic<int> done{0};
    std::vector<std::thread> ts;
    std::vector<uint64_t> pushed(P, 0);
    for (int t = 0; t < P; ++t) ts.emplace_back([&, t] {
        for (uint64_t i = 0; i < N; ++i) {
            size_t n = 1 + (i % 5);
            R rs[5];
            uint64_t s = uvm::next_seq();
            for (size_t k = 0; k < n; ++k) rs[k] = R{s, (uint64_t)t, i, k};
            if (ring.push(rs, n)) pushed[t] += n;
        }
        done++;
    });
    std::vector<R> buf(1000);
    uint64_t got = 0, bad = 0;
    std::vector<int64_t> last(P, -1);
    R prev{}; size_t inrun = 0;
    for (;;) {
        bool fin = done.load() == P;
        size_t n = ring.drain(buf.data(), buf.size());
        for (size_t j = 0; j < n; ++j) {
            R r = buf[j];
            if (r.k == 0) {  // new run: the previous run was complete
                if (inrun && inrun != 1 + (prev.i % 5)) bad++;
                if ((int64_t)r.i <= last[r.thread]) bad++;
                last[r.thread] = r.i; inrun = 1;
            } else {
                if (r.thread != prev.thread || r.i != prev.i || r.k != prev.k + 1) bad++;
                inrun++;
            }
            prev = r; got++;
        }
        if (fin && n == 0) break;
    }
    uint64_t tot = 0; for (auto p : pushed) tot += p;
    for (auto& t : ts) t.join();
    printf("got %llu pushed %llu dropped %llu bad %llu\n", (unsigned long long)got, (unsigned long long)tot,
           (unsigned long long)ring.dropped(), (unsigned long long)bad);
    return (got == tot && bad == 0) ? 0 : 1;
}
