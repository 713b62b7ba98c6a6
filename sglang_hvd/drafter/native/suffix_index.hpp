// Occurrence index over token documents: the storage behind both suffix tries of the
// native drafter. Same semantics as sglang_hvd/drafter/token_index.py (the reference):
// documents are runs of an arena separated by SENTINEL, each token carries the stamp of
// the moment it was appended (a per-index clock), and a depth-limited suffix trie's counts
// follow from where strings end. What differs is how lookups are made fast:
//
//   bigram index   (prev, tok) -> arena positions of tok preceded by prev, always in
//                  the order they were appended (stamp order: a moved document's entries
//                  are rewritten in place); a list that held an entry of a removed
//                  document is marked stale and filtered once, at its next lookup, so a
//                  lookup copies the newest entries without reading the arena
//   tokens         tok -> its live occurrences, and its successors {next: (count, newest
//                  stamp)} with the best child cached, so a one-token pattern needs no scan
//                  of its (possibly huge) occurrence set. One record per token: an append
//                  counts a token and updates its predecessor's successors, and the
//                  predecessor's record is the one its own append touched just before
//
// Positions are never reused until a compaction, which moves the bigram lists' live entries.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "flat_map.hpp"

namespace hvd {

constexpr int32_t SENTINEL = -1;

inline uint64_t bigram_key(int32_t prev, int32_t tok) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(prev)) << 32) | static_cast<uint32_t>(tok);
}

class Index {
public:
    explicit Index(int pad) : pad_(pad) {
        arena_.assign(static_cast<size_t>(2 * pad + 1024), SENTINEL);
        stamps_.assign(arena_.size(), 0);
        size_ = pad;
    }

    struct Doc {
        int64_t start, len, cap;
    };

    void add_doc(int64_t doc, const int32_t* tokens, int64_t n, int64_t spare) {
        if (docs_.count(doc)) throw std::invalid_argument("document already exists");
        if (n > 1024) {  // a long prompt: size the tables once instead of rehashing as they grow
            bigrams_.reserve(bigrams_.size() + static_cast<size_t>(n));
            tokens_.reserve(tokens_.size() + static_cast<size_t>(n / 4));
        }
        int64_t start = reserve(n + spare + 1);
        docs_[doc] = Doc{start, 0, n + spare};
        append_tokens(docs_[doc], tokens, n);
    }

    void extend(int64_t doc, const int32_t* tokens, int64_t n) {
        auto it = docs_.find(doc);
        if (it == docs_.end()) throw std::out_of_range("unknown document");
        if (n == 0) return;
        Doc& d = it->second;
        if (d.len + n > d.cap) relocate(doc, std::max<int64_t>(2 * d.cap, d.len + n + 256));
        append_tokens(docs_[doc], tokens, n);
    }

    // Drop a document's tokens from position `keep` on (as if they had never been appended).
    // Their slots will be written again, so their bigram entries must go too: they are the
    // newest entries of their lists as long as the index holds this one document (the
    // request's own index, the only user), so they are popped from the back.
    void truncate_doc(int64_t doc, int64_t keep) {
        Doc& d = docs_.at(doc);
        if (keep >= d.len) return;
        if (docs_.size() != 1) throw std::logic_error("truncate_doc needs a single-document index");
        std::vector<std::pair<int32_t, int32_t>> repair;
        const int64_t cut = d.start + keep, end = d.start + d.len;
        for (int64_t i = cut; i < end; ++i) {
            uncount(i, repair);
            if (arena_[i - 1] < 0) continue;
            Postings* found = bigrams_.find(bigram_key(arena_[i - 1], arena_[i]));
            std::vector<int32_t>* list = found ? &found->ends : nullptr;
            while (list && !list->empty() && list->back() >= cut && list->back() < end) list->pop_back();
        }
        for (int64_t i = d.start + keep; i < d.start + d.len; ++i) arena_[i] = SENTINEL;
        repair_newest(repair);
        num_live_ -= d.len - keep;
        d.len = keep;
    }

    int64_t remove_doc(int64_t doc) {
        auto it = docs_.find(doc);
        if (it == docs_.end()) throw std::out_of_range("unknown document");
        Doc d = it->second;
        docs_.erase(it);
        // Counts first (they need each token's predecessor), then free the slots, then
        // repair the newest-stamp of pairs that lost their newest occurrence.
        std::vector<std::pair<int32_t, int32_t>> repair;
        for (int64_t i = d.start; i < d.start + d.len; ++i) {
            uncount(i, repair);
            if (arena_[i - 1] < 0) continue;
            if (Postings* list = bigrams_.find(bigram_key(arena_[i - 1], arena_[i]))) list->stale = true;
        }
        for (int64_t i = d.start; i < d.start + d.len; ++i) arena_[i] = SENTINEL;
        repair_newest(repair);
        num_live_ -= d.len;
        dead_ += d.cap + 1;
        // Compact once freed documents fill half the arena in use (amortised: a compaction
        // costs the live tokens, and at least as many slots were freed since the last one).
        // Not on live tokens against the arena: documents' spare room (short responses
        // keep 64 slots) would make that true after every removal.
        if (size_ > 4 * pad_ + 4096 && 2 * dead_ > size_) compact();
        return d.len;
    }

    const Doc& doc(int64_t d) const { return docs_.at(d); }
    bool has_doc(int64_t d) const { return docs_.count(d) != 0; }
    const int32_t* arena() const { return arena_.data(); }
    const int64_t* stamps() const { return stamps_.data(); }
    int64_t num_live() const { return num_live_; }
    int64_t num_compactions() const { return compactions_; }

    int64_t count(int32_t tok) const {
        const Token* t = tokens_.find(tok);
        return t ? t->count : 0;
    }

    // Live end positions of the bigram (prev, tok), oldest first (ascending stamps).
    // Only the newest `limit` of them: a copy of the list's back, the arena not read (a
    // stale list is filtered first, once). Returns how many there are in all (the pair's live count).
    int64_t bigram_ends(int32_t prev, int32_t tok, std::vector<int64_t>& out, int64_t limit) {
        out.clear();
        uint64_t key = bigram_key(prev, tok);
        Postings* found = bigrams_.find(key);
        if (!found) return 0;
        if (__atomic_load_n(&found->stale, __ATOMIC_ACQUIRE)) {  // (drafts run on several threads: lazy_)
            std::lock_guard<std::mutex> lock(*lazy_);
            if (found->stale) {
                drop_stale(found->ends, prev, tok);
                __atomic_store_n(&found->stale, false, __ATOMIC_RELEASE);
            }
        }
        const std::vector<int32_t>& list = found->ends;
        const size_t n = std::min(list.size(), static_cast<size_t>(std::max<int64_t>(limit, 0)));
        out.assign(list.end() - static_cast<std::ptrdiff_t>(n), list.end());
        return static_cast<int64_t>(list.size());
    }

    // Every token seen after `prev`: (token, live count, newest stamp).
    void successors(int32_t prev, std::vector<std::tuple<int32_t, int64_t, int64_t>>& out) const {
        out.clear();
        const Token* s = tokens_.find(prev);
        if (!s) return;
        s->children.for_each([&](int32_t tok, const Child& c) { out.emplace_back(tok, c.count, c.newest); });
    }

    // The most frequent token after `prev` (ties: the most recently appended). False if none.
    bool best_successor(int32_t prev, int32_t& tok, int64_t& count) {
        Token* found = tokens_.find(prev);
        if (!found || found->children.empty()) return false;
        Token& s = *found;
        if (__atomic_load_n(&s.dirty, __ATOMIC_ACQUIRE)) {  // (drafts run on several threads: lazy_)
            std::lock_guard<std::mutex> lock(*lazy_);
            if (s.dirty) {
                int32_t best = -1;
                int64_t bc = -1, bs = -1;
                s.children.for_each([&](int32_t t, const Child& c) {
                    if (c.count > bc || (c.count == bc && c.newest > bs)) {
                        best = t;
                        bc = c.count;
                        bs = c.newest;
                    }
                });
                s.best = best;
                __atomic_store_n(&s.dirty, false, __ATOMIC_RELEASE);
            }
        }
        tok = s.best;
        count = s.children.find(s.best)->count;
        return true;
    }

    size_t nbytes() const {
        size_t b = arena_.capacity() * sizeof(int32_t) + stamps_.capacity() * sizeof(int64_t);
        b += bigrams_.capacity() * (sizeof(uint64_t) + sizeof(Postings));
        bigrams_.for_each([&](uint64_t, const Postings& v) { b += v.ends.capacity() * sizeof(int32_t); });
        b += tokens_.capacity() * (sizeof(int32_t) + sizeof(Token));
        tokens_.for_each([&](int32_t, const Token& s) { b += s.children.capacity() * (sizeof(int32_t) + sizeof(Child)); });
        return b;
    }

private:
    struct Child {
        int64_t count = 0;
        int64_t newest = -1;  // stamp of the most recent occurrence
    };
    struct Token {
        int64_t count = 0;  // live occurrences of the token
        FlatMap<int32_t, Child, -1> children;  // the tokens seen after it
        int32_t best = -1;
        bool dirty = true;
    };

    // Remove position i's token from its count and its predecessor's successors (slot still holds it).
    void uncount(int64_t i, std::vector<std::pair<int32_t, int32_t>>& repair) {
        int32_t tok = arena_[i];
        tokens_[tok].count -= 1;
        int32_t prev = arena_[i - 1];
        if (prev < 0) return;
        Token& s = *tokens_.find(prev);
        Child* c = s.children.find(tok);
        c->count -= 1;
        s.dirty = true;
        if (c->count == 0) {
            s.children.erase(tok);
        } else if (c->newest == stamps_[i]) {
            repair.emplace_back(prev, tok);
        }
    }

    // After slots were freed: recompute the newest stamp of the listed pairs (their lists are in
    // stamp order: the last entry still live, read from the back).
    void repair_newest(const std::vector<std::pair<int32_t, int32_t>>& repair) {
        for (auto& [prev, tok] : repair) {
            Child* c = tokens_.find(prev)->children.find(tok);
            if (!c) continue;
            int64_t newest = -1;
            if (const Postings* list = bigrams_.find(bigram_key(prev, tok)))
                for (auto r = list->ends.rbegin(); r != list->ends.rend(); ++r)
                    if (holds(*r, prev, tok)) {
                        newest = stamps_[*r];
                        break;
                    }
            c->newest = newest;
        }
    }

    // Whether slot e still ends the pair (prev, tok) (not a removed document's entry).
    bool holds(int32_t e, int32_t prev, int32_t tok) const { return arena_[e] == tok && arena_[e - 1] == prev; }

    int64_t reserve(int64_t n) {
        if (size_ + n + pad_ > static_cast<int64_t>(arena_.size())) {
            if (dead_ > num_live_ && size_ > 4096) compact();
            if (size_ + n + pad_ > static_cast<int64_t>(arena_.size())) {
                size_t grown = std::max<size_t>(2 * arena_.size(), static_cast<size_t>(size_ + n + pad_));
                if (grown > static_cast<size_t>(INT32_MAX)) throw std::length_error("token index over 2^31 slots");
                arena_.resize(grown, SENTINEL);
                stamps_.resize(grown, 0);
            }
        }
        int64_t start = size_;
        size_ += n;
        return start;
    }

    void append_tokens(Doc& d, const int32_t* tokens, int64_t n) {
        for (int64_t k = 0; k < n; ++k) {
            int64_t i = d.start + d.len + k;
            int32_t tok = tokens[k];
            arena_[i] = tok;
            stamps_[i] = clock_++;
            tokens_[tok].count += 1;
            int32_t prev = arena_[i - 1];
            if (prev >= 0) {
                bigrams_[bigram_key(prev, tok)].ends.push_back(static_cast<int32_t>(i));
                Token& s = tokens_[prev];  // present: counted at its own append
                Child& c = s.children[tok];
                c.count += 1;
                c.newest = stamps_[i];
                // A child that just grew has the newest stamp: it is the best if it ties or beats it.
                if (!s.dirty && (s.best < 0 || s.best == tok || c.count >= s.children.find(s.best)->count)) s.best = tok;
            }
        }
        d.len += n;
        num_live_ += n;
    }

    void relocate(int64_t doc, int64_t new_cap) {
        Doc d = docs_[doc];
        int64_t start = reserve(new_cap + 1);
        Doc& moved = docs_[doc];  // reserve may compact and move documents: reread
        d = moved;
        for (int64_t k = 0; k < d.len; ++k) {
            arena_[start + k] = arena_[d.start + k];
            stamps_[start + k] = stamps_[d.start + k];
            arena_[d.start + k] = SENTINEL;
        }
        for (int64_t k = 1; k < d.len; ++k) {  // each entry rewritten where it is: the lists stay in stamp order
            Postings* list = bigrams_.find(bigram_key(arena_[start + k - 1], arena_[start + k]));
            const int64_t at = list ? entry_of(list->ends, d.start + k, stamps_[start + k]) : -1;
            if (at < 0) throw std::logic_error("token index: a moved token's bigram entry is missing");
            list->ends[static_cast<size_t>(at)] = static_cast<int32_t>(start + k);
        }
        dead_ += d.cap + 1;
        moved = Doc{start, d.len, new_cap};
    }

    // The entries of removed documents (their slots SENTINEL: no slot is reused before a
    // compaction, which drops such entries itself) dropped from a list, the rest kept in order.
    void drop_stale(std::vector<int32_t>& list, int32_t prev, int32_t tok) {
        size_t w = 0;
        for (int32_t e : list)
            if (holds(e, prev, tok)) list[w++] = e;
        list.resize(w);
    }

    // Where `list` (in stamp order; a removed document's stale entries keep their slots' stamps,
    // still in order) holds position `pos`, whose stamp is `stamp`; -1 if it does not. Looked
    // for from the back, in doubling steps, then by bisection: a moved document is most often
    // a growing response, whose entries are among its lists' newest.
    int64_t entry_of(const std::vector<int32_t>& list, int64_t pos, int64_t stamp) const {
        const int64_t n = static_cast<int64_t>(list.size());
        int64_t hi = n, step = 1;  // list[hi:] stamps > stamp
        while (hi - step >= 0 && stamps_[list[static_cast<size_t>(hi - step)]] > stamp) {
            hi -= step;
            step *= 2;
        }
        int64_t lo = std::max<int64_t>(hi - step, 0);  // list[lo] stamp <= stamp (or lo == 0)
        while (lo < hi) {  // the first entry of list[lo:hi] whose stamp >= stamp
            const int64_t mid = lo + (hi - lo) / 2;
            if (stamps_[list[static_cast<size_t>(mid)]] < stamp) lo = mid + 1; else hi = mid;
        }
        return lo < n && list[static_cast<size_t>(lo)] == pos ? lo : -1;
    }

    // Documents packed from the arena's start, in their order there, each keeping its spare
    // room. The bigram lists are not rebuilt: each keeps its live entries, moved with their
    // documents, in the order they were in (stamp order), and drops those of removed
    // documents (no list is stale after it). A
    // rebuild (every live token re-inserted into the table, every list sorted) stalled the
    // step that compacted a full 2 M-token cache for ~0.5 s.
    void compact() {
        std::vector<std::pair<int64_t, int64_t>> order;  // (start, doc)
        int64_t need = 2 * pad_;
        for (auto& [id, d] : docs_) { order.emplace_back(d.start, id); need += d.cap + 1; }
        std::sort(order.begin(), order.end());
        std::vector<int32_t> arena(static_cast<size_t>(std::max<int64_t>(need, 2 * pad_ + 1024)), SENTINEL);
        std::vector<int64_t> stamps(arena.size(), 0);
        std::vector<int32_t> moved_to(static_cast<size_t>(size_), -1);  // old slot -> new slot (-1: no live token)
        int64_t size = pad_;
        for (auto& [s, id] : order) {
            Doc& d = docs_[id];
            for (int64_t k = 0; k < d.len; ++k) {
                arena[size + k] = arena_[d.start + k];
                stamps[size + k] = stamps_[d.start + k];
                moved_to[d.start + k] = static_cast<int32_t>(size + k);
            }
            d.start = size;
            size += d.cap + 1;
        }
        std::vector<uint64_t> emptied;
        bigrams_.for_each([&](uint64_t key, Postings& postings) {
            std::vector<int32_t>& list = postings.ends;
            size_t w = 0;
            for (int32_t e : list)
                if (e < size_ && moved_to[e] >= 0) list[w++] = moved_to[e];
            list.resize(w);
            postings.stale = false;
            if (w == 0) emptied.push_back(key);
        });
        for (uint64_t key : emptied) bigrams_.erase(key);
        arena_.swap(arena);
        stamps_.swap(stamps);
        size_ = size;
        dead_ = 0;
        compactions_ += 1;
    }

    int pad_;
    std::vector<int32_t> arena_;
    std::vector<int64_t> stamps_;
    int64_t size_ = 0, clock_ = 0, num_live_ = 0, dead_ = 0, compactions_ = 0;
    std::unordered_map<int64_t, Doc> docs_;
    // A bigram's end positions, in the order they were appended; ``stale``: it may hold
    // entries of removed documents (dropped at its next lookup).
    struct Postings {
        std::vector<int32_t> ends;
        bool stale = false;
    };
    FlatMap<uint64_t, Postings, UINT64_MAX> bigrams_;
    FlatMap<int32_t, Token, -1> tokens_;
    // Lookups are reads but for two lazy repairs: a bigram list's stale entries dropped
    // (``stale``) and a token's best successor recomputed (``dirty``). A batch's drafts run
    // on several threads at once (pool.hpp), so each repair is made under this lock, its flag
    // read with acquire and cleared with release (a reader that sees it clear sees the repair).
    // Appends, removals and compactions run on one thread, with no draft running.
    std::unique_ptr<std::mutex> lazy_ = std::make_unique<std::mutex>();
};

}  // namespace hvd
