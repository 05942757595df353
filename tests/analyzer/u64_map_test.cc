// u64_map against std::unordered_map under random inserts, erases and lookups, with clustered keys.
#include <catch2/catch.hpp>

#include <random>
#include <unordered_map>

#include "u64_map.h"

using gpumem::analysis::u64_map;

TEST_CASE("u64_map behaves like std::unordered_map", "[u64_map]") {
    std::mt19937_64 rng(7);
    u64_map<uint64_t> m;
    std::unordered_map<uint64_t, uint64_t> ref;
    // Few distinct keys, so probe runs collide and wrap, and erases shift long runs back; key 0
    // is an ordinary key.
    for (int step = 0; step < 200000; ++step) {
        uint64_t k = (rng() % 3000) * 512;
        switch (rng() % 4) {
        case 0:
        case 1: {
            uint64_t v = rng();
            auto [p, fresh] = m.try_emplace(k, v);
            auto [it, ref_fresh] = ref.try_emplace(k, v);
            REQUIRE(fresh == ref_fresh);
            REQUIRE(*p == it->second);
            break;
        }
        case 2: REQUIRE(m.erase(k) == (ref.erase(k) == 1)); break;
        case 3: {
            const uint64_t* p = m.find(k);
            auto it = ref.find(k);
            REQUIRE((p != nullptr) == (it != ref.end()));
            if (p) REQUIRE(*p == it->second);
            break;
        }
        }
        REQUIRE(m.size() == ref.size());
        if (step % 20000 == 0) {
            size_t n = 0;
            for (const auto& e : m) {
                REQUIRE(ref.at(e.first) == e.second);
                ++n;
            }
            REQUIRE(n == ref.size());
        }
    }
    m.clear();
    CHECK(m.empty());
    CHECK(m.find(0) == nullptr);
    m[0] = 5;
    CHECK(*m.find(0) == 5);
}
