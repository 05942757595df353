// Runs independent tasks on all cores: what `gpumem report` and `gpumem replay` use to take one log
// (or one replay) per thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace gpumem::analysis {

// The most threads `-j N` asks for: more than any machine's cores, and few enough to be created.
inline constexpr unsigned k_max_jobs = 1024;

// The thread count for `-j N`: N, or every core when N is 0 (no -j).
inline unsigned jobs_or_cores(unsigned jobs) { return jobs ? jobs : std::max(1u, std::thread::hardware_concurrency()); }

// Calls f(i) for every i in [0, n), on up to `jobs` threads (the caller's among them), each taking
// the next index as it finishes one: a long log does not hold up the short ones behind it.  f must
// not throw, and writes only its own slot of any shared output, so results come out in index
// order whatever the threads' timing.
template <typename F>
void parallel_for(size_t n, unsigned jobs, F&& f) {
    unsigned workers = std::max(1u, std::min<unsigned>(jobs, unsigned(std::min<size_t>(n, 1u << 16))));
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i; (i = next.fetch_add(1)) < n;) f(i);
    };
    std::vector<std::thread> ts;
    for (unsigned w = 1; w < workers; ++w) ts.emplace_back(work);
    work();
    for (auto& t : ts) t.join();
}

}  // namespace gpumem::analysis
