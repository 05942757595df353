// An open-addressing hash map keyed by uint64_t (addresses, handles, sizes) for the replay's
// per-event lookups, where std::unordered_map's node allocation and pointer chasing dominated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpumem::analysis {

// Linear probing with backward-shift deletion (no tombstones, so lookups stay short however many
// erases happen).  Any key is allowed, 0 included: occupancy is kept apart from the keys, because
// the analyzer reads untrusted logs.  Erase moves other entries: pointers to values and iterators
// are invalidated by erase and by insertion; copy a value out before erasing it.  Iteration order
// is unspecified, as with std::unordered_map; the replay only iterates where order cannot matter
// (sums, or a sort by a unique key).
template <typename V>
class u64_map {
public:
    struct entry {
        uint64_t first;
        V second;
    };

    template <bool Const>
    class iter {
        using map_t = std::conditional_t<Const, const u64_map, u64_map>;
        using ref_t = std::conditional_t<Const, const entry&, entry&>;
        map_t* m_;
        size_t i_;
        void skip() {
            while (i_ < m_->used_.size() && !m_->used_[i_]) ++i_;
        }

    public:
        iter(map_t* m, size_t i) : m_(m), i_(i) { skip(); }
        ref_t operator*() const { return m_->slots_[i_]; }
        auto* operator->() const { return &m_->slots_[i_]; }
        iter& operator++() {
            ++i_;
            skip();
            return *this;
        }
        bool operator!=(const iter& o) const { return i_ != o.i_; }
        bool operator==(const iter& o) const { return i_ == o.i_; }
    };
    using iterator = iter<false>;
    using const_iterator = iter<true>;

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    iterator begin() { return iterator(this, 0); }
    iterator end() { return iterator(this, used_.size()); }
    const_iterator begin() const { return const_iterator(this, 0); }
    const_iterator end() const { return const_iterator(this, used_.size()); }

    V* find(uint64_t k) {
        if (!size_) return nullptr;
        for (size_t i = home(k);; i = (i + 1) & mask_) {
            if (!used_[i]) return nullptr;
            if (slots_[i].first == k) return &slots_[i].second;
        }
    }
    const V* find(uint64_t k) const { return const_cast<u64_map*>(this)->find(k); }
    bool contains(uint64_t k) const { return find(k) != nullptr; }

    // The value of k, inserted as `v` when absent; second is true when it was inserted.
    std::pair<V*, bool> try_emplace(uint64_t k, const V& v) {
        if ((size_ + 1) * 2 > slots_.size()) grow();
        size_t i = home(k);
        for (; used_[i]; i = (i + 1) & mask_)
            if (slots_[i].first == k) return {&slots_[i].second, false};
        used_[i] = 1;
        slots_[i] = entry{k, v};
        ++size_;
        return {&slots_[i].second, true};
    }
    V& operator[](uint64_t k) { return *try_emplace(k, V{}).first; }
    void insert_or_assign(uint64_t k, const V& v) {
        auto [p, fresh] = try_emplace(k, v);
        if (!fresh) *p = v;
    }

    bool erase(uint64_t k) {
        if (!size_) return false;
        size_t i = home(k);
        for (;; i = (i + 1) & mask_) {
            if (!used_[i]) return false;
            if (slots_[i].first == k) break;
        }
        // Backward shift: pull later members of the probe run into the hole when their home
        // position allows it, so no lookup ever stops early at the hole.
        size_t hole = i;
        for (size_t j = (i + 1) & mask_; used_[j]; j = (j + 1) & mask_) {
            size_t h = home(slots_[j].first);
            // j may move to hole unless its home lies cyclically in (hole, j].
            bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
            if (stays) continue;
            slots_[hole] = std::move(slots_[j]);
            hole = j;
        }
        used_[hole] = 0;
        slots_[hole] = entry{};
        --size_;
        return true;
    }

    void clear() {
        if (!size_) return;
        for (size_t i = 0; i < used_.size(); ++i)
            if (used_[i]) {
                used_[i] = 0;
                slots_[i] = entry{};
            }
        size_ = 0;
    }

private:
    size_t home(uint64_t k) const {
        // splitmix64's finalizer: addresses are multiples of 512 and sizes of 512, so low bits alone
        // would collide; this spreads every input bit over the high bits taken by the shift.
        k ^= k >> 30;
        k *= 0xbf58476d1ce4e5b9ULL;
        k ^= k >> 27;
        k *= 0x94d049bb133111ebULL;
        k ^= k >> 31;
        return size_t(k) & mask_;
    }
    void grow() {
        size_t n = slots_.empty() ? 16 : slots_.size() * 2;
        std::vector<entry> old_slots(n);
        std::vector<uint8_t> old_used(n, 0);
        old_slots.swap(slots_);
        old_used.swap(used_);
        mask_ = n - 1;
        size_ = 0;
        for (size_t i = 0; i < old_used.size(); ++i)
            if (old_used[i]) try_emplace(old_slots[i].first, old_slots[i].second);
    }

    std::vector<entry> slots_;
    std::vector<uint8_t> used_;
    size_t mask_ = 0, size_ = 0;
};

}  // namespace gpumem::analysis
