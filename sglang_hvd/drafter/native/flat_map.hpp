// An open-addressing hash map for the index's tables (token counts, bigram lists,
// successors): keys are non-negative integers, one key value is reserved for empty slots,
// slots live in two flat arrays (linear probing, power-of-two capacity, load <= 3/4,
// deletion by backward shift: no tombstones). std::unordered_map allocates a node per
// entry and chases a pointer per lookup; every appended token updates several of these
// tables in two indexes, so that was most of an append's time.
//
// Not a drop-in for std::unordered_map: find returns a pointer (nullptr: absent), erase
// takes a key, and an insertion (operator[] of a new key, reserve) may move every value;
// a lookup of a key present never does.
// The index never holds a value's address across an insertion into the same map.
// Iteration order is the slots' order; the index only iterates where order cannot matter
// (sums, sorting each list, choices broken by unique stamps).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace hvd {

template <class K, class V, K kEmpty>
class FlatMap {
public:
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    size_t capacity() const { return keys_.size(); }

    void clear() {
        keys_.clear();
        vals_.clear();
        size_ = 0;
        mask_ = 0;
    }

    // Empty, keeping its capacity (a table refilled often: no allocation); an empty slot
    // holds a default value, as after erase.
    void reset() {
        std::fill(keys_.begin(), keys_.end(), kEmpty);
        std::fill(vals_.begin(), vals_.end(), V());
        size_ = 0;
    }

    // Room for n entries without growing.
    void reserve(size_t n) {
        size_t cap = 8;
        while (cap * 3 < n * 4) cap *= 2;
        if (cap > keys_.size()) rehash(cap);
    }

    V* find(K k) {
        if (keys_.empty()) return nullptr;
        for (size_t i = slot(k);; i = (i + 1) & mask_) {
            if (keys_[i] == k) return &vals_[i];
            if (keys_[i] == kEmpty) return nullptr;
        }
    }
    const V* find(K k) const { return const_cast<FlatMap*>(this)->find(k); }

    // The value of k, default-constructed if absent (only then may the map grow).
    V& operator[](K k) {
        if (V* v = find(k)) return *v;
        if ((size_ + 1) * 4 > keys_.size() * 3) rehash(keys_.empty() ? 8 : 2 * keys_.size());
        size_t i = slot(k);
        while (keys_[i] != kEmpty) i = (i + 1) & mask_;
        keys_[i] = k;
        ++size_;
        return vals_[i];
    }

    // Removes k (if present); later entries of its probe run shift back into the hole.
    bool erase(K k) {
        if (keys_.empty()) return false;
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
        for (size_t i = 0; i < keys_.size(); ++i)
            if (keys_[i] != kEmpty) f(keys_[i], vals_[i]);
    }
    template <class F>
    void for_each(F&& f) const {
        for (size_t i = 0; i < keys_.size(); ++i)
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
        std::vector<K> keys(cap, kEmpty);
        std::vector<V> vals(cap);
        keys_.swap(keys);
        vals_.swap(vals);
        mask_ = cap - 1;
        for (size_t i = 0; i < keys.size(); ++i) {
            if (keys[i] == kEmpty) continue;
            size_t j = slot(keys[i]);
            while (keys_[j] != kEmpty) j = (j + 1) & mask_;
            keys_[j] = keys[i];
            vals_[j] = std::move(vals[i]);
        }
    }

    std::vector<K> keys_;
    std::vector<V> vals_;
    size_t size_ = 0;
    size_t mask_ = 0;
};

}  // namespace hvd
