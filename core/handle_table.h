// A fixed lock-free table of (driver handle, small value) entries: the hooks' notes on handles (cuMemRetainAllocationHandle's extra references, memory pools' kinds, green contexts' devices).
//
// The hooks keep such notes where the driver tells nothing when asked later: which cuMemRelease of
// a VMM handle takes back a retained reference, what memory a CUmemoryPool hands out, which device
// a CUgreenCtx's destruction releases.  A note may be read or dropped from a signal handler's exit
// path, where a lock this thread holds would never be given back: so no lock and no allocation,
// only atomics on a fixed array.
//
// A note goes before the driver call that frees its handle, and comes back if the driver refuses:
// once the driver has freed a handle, another thread may get the same value back for a new object
// and note it, and the new object's note must be the one found.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpumem {

// Up to k_slots entries, without a lock.  A key may have several entries: each add makes one, each
// take ends one (a multiset: one entry per retained reference).  The keys 0 (a free slot) and ~0
// (a slot being filled or emptied) are no handle's.
class handle_table {
  public:
    static constexpr int k_slots = 1024;

    // A new entry of key with value, beside any it has.  False where none can be kept: key is 0 or
    // ~0, or every slot is taken.
    bool add(uint64_t key, uint8_t value) noexcept;
    // The value of one of key's entries (the first), if it has one.
    bool find(uint64_t key, uint8_t* value) const noexcept;
    // Sets the value of every entry of key in place, so that no find meanwhile misses it; false
    // where it has none.  An entry taken meanwhile is not set, nor is what took its slot.
    bool set(uint64_t key, uint8_t value) noexcept;
    // Takes one entry of key out: true, with its value where value is not null, if it had one.
    bool take(uint64_t key, uint8_t* value = nullptr) noexcept;
    // Takes every entry of key out: how many there were; *value gets the first one's, where value
    // is not null.
    int take_all(uint64_t key, uint8_t* value) noexcept;
    // Entries kept now.
    int size() const noexcept { return used_.load(std::memory_order_acquire); }
    // Slots that find, set and take scan: those below the highest ever taken.  Free slots are taken
    // lowest first, so a program that keeps a few entries at a time pays a few loads.
    int scanned() const noexcept { return high_.load(std::memory_order_acquire); }

  private:
    static constexpr uint64_t k_busy = ~uint64_t(0);
    // Takes slot i out if it holds key: true, with its value.
    bool take_slot(int i, uint64_t key, uint8_t* value) noexcept;
    // A slot is free (0), busy (one thread fills or empties it: others pass it by, none waits), or
    // holds a key whose word was written before the key (release), so that a reader who finds the
    // key reads its value.  A slot's word holds its value (the low byte) and its generation (the
    // rest), which every add and take moves on, while the slot is busy: an entry is the key of a
    // slot for one generation.  An add claims a free slot busy, starts a generation with its value,
    // then writes the key; a take claims the key's slot busy, ends the generation (reading the value
    // in the same step), then frees it.  A set changes the value by a compare-and-swap of the word
    // it read while the slot held its key, so it fails once that generation has ended: a set whose
    // entry was taken, and its slot filled for another key, between its look at the key and its
    // write would write its value into the other key's entry (a pool's note set again while the
    // pool's destroy and another pool's creation got the slot: a 1-byte store could).  A find
    // re-reads the key and the generation after the value, so it never returns the value of a
    // generation that was not its key's.  56 bits of generations: never wrap.
    std::atomic<uint64_t> keys_[k_slots] = {};
    std::atomic<uint64_t> words_[k_slots] = {};
    std::atomic<int> high_{0};
    // Counted before a slot is filled and after one is emptied: 0 means none is kept, so a find or
    // take in a program that keeps none costs one load.
    std::atomic<int> used_{0};

    static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
                  "a signal handler may use the table: its atomics must not take a lock");
};

}  // namespace gpumem
