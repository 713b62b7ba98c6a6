// An open-addressing hash map for the index's tables (token counts, bigram lists,
// successors): keys are non-negative integers, one key value is reserved for empty slots,
// slots live in two flat arrays (linear probing, power-of-two capacity, load <= 3/4,
// deletion by backward shift: no tombstones). std::unordered_map allocates a node per
// entry and chases a pointer per lookup; every appended token updates several of these
// tables in two indexes, so that was most of an append's time.
//
// Not a drop-in for std::unordered_map: find returns a pointer (nullptr: absent), erase
// takes a key, and an insertion (operator[] of a new key, reserve) may move every value;
// a lookup of a key present never does. Move-only, and 24 bytes: two arrays and two
// 32-bit counts (a map held in a table's value, as a token's successors are, keeps that
// value within a cache line).
// The index never holds a value's address across an insertion into the same map.
// Iteration order is the slots' order; the index only iterates where order cannot matter
// (sums, sorting each list, choices broken by unique stamps).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

namespace hvd {

template <class K, class V, K kEmpty>
class FlatMap {
public:
    FlatMap() = default;
    FlatMap(FlatMap&&) noexcept = default;
    FlatMap& operator=(FlatMap&&) noexcept = default;

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    size_t capacity() const { return keys_ ? size_t(mask_) + 1 : 0; }

    void clear() {
        keys_.reset();
        vals_.reset();
        size_ = 0;
        mask_ = 0;
    }

    // Empty, keeping its capacity (a table refilled often: no allocation); an empty slot
    // holds a default value, as after erase.
    void reset() {
        const size_t cap = capacity();
        std::fill(keys_.get(), keys_.get() + cap, kEmpty);
        std::fill(vals_.get(), vals_.get() + cap, V());
        size_ = 0;
    }

    // Room for n entries without growing.
    void reserve(size_t n) {
        size_t cap = 8;
        while (cap * 3 < n * 4) cap *= 2;
        if (cap > capacity()) rehash(cap);
    }

    V* find(K k) {
        if (!keys_) return nullptr;
        for (size_t i = slot(k);; i = (i + 1) & mask_) {
            if (keys_[i] == k) return &vals_[i];
            if (keys_[i] == kEmpty) return nullptr;
        }
    }
    const V* find(K k) const { return const_cast<FlatMap*>(this)->find(k); }

    // The value of k, default-constructed if absent (only then may the map grow).
    V& operator[](K k) {
        if (V* v = find(k)) return *v;
        if ((size_t(size_) + 1) * 4 > capacity() * 3) rehash(keys_ ? 2 * capacity() : 8);
        size_t i = slot(k);
        while (keys_[i] != kEmpty) i = (i + 1) & mask_;
        keys_[i] = k;
        ++size_;
        return vals_[i];
    }

    // Removes k (if present); later entries of its probe run shift back into the hole.
    bool erase(K k) {
        if (!keys_) return false;
        size_t i = slot(k);
        while (keys_[i] != k) {
            if (keys_[i] == kEmpty) return false;
            i = (i + 1) & mask_;
        }
        for (size_t j = (i + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
            const size_t home = slot(keys_[j]);
            // entry j may fill hole i when its home slot does not lie cyclically in (i, j]
            if (((j - home) & mask_) >= ((j - i) & mask_)) {
                keys_[i] = keys_[j];
                vals_[i] = std::move(vals_[j]);
                i = j;
            }
        }
        keys_[i] = kEmpty;
        vals_[i] = V();
        --size_;
        return true;
    }

    // f(key, value) for every entry.
    template <class F>
    void for_each(F&& f) {
        for (size_t i = 0, cap = capacity(); i < cap; ++i)
            if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
    }
    template <class F>
    void for_each(F&& f) const {
        for (size_t i = 0, cap = capacity(); i < cap; ++i)
            if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
    }

private:
    size_t slot(K k) const {
        uint64_t x = static_cast<uint64_t>(k);  // a 64-bit mix (splitmix64's finalizer): ids cluster
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
        return static_cast<size_t>(x) & mask_;
    }

    void rehash(size_t cap) {
        if (cap > (size_t(1) << 31)) throw std::length_error("hash table over 2^31 slots");
        std::unique_ptr<K[]> keys(new K[cap]);
        std::unique_ptr<V[]> vals(new V[cap]());
        std::fill(keys.get(), keys.get() + cap, kEmpty);
        const size_t old_cap = capacity();
        keys_.swap(keys);
        vals_.swap(vals);
        mask_ = static_cast<uint32_t>(cap - 1);
        for (size_t i = 0; i < old_cap; ++i) {
            if (keys[i] == kEmpty) continue;
            size_t j = slot(keys[i]);
            while (keys_[j] != kEmpty) j = (j + 1) & mask_;
            keys_[j] = keys[i];
            vals_[j] = std::move(vals[i]);
        }
    }

    std::unique_ptr<K[]> keys_;
    std::unique_ptr<V[]> vals_;
    uint32_t size_ = 0;
    uint32_t mask_ = 0;
};

}  // namespace hvd
