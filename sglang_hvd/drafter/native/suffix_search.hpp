// The SuffixDecoding search of one tree, as sglang_hvd/drafter/suffix_match.py defines it:
// for every pattern length p the occurrences of the context's last p tokens, a greedy
// most-frequent-child walk (ties: most recently appended), the best score over all
// lengths, ties to the longer pattern. Lengths that share an occurrence set share a walk.
//
// The sets are found from the bigram index: E2 = ends of the context's last two tokens,
// then each occurrence's backward match length. A one-token pattern (set E1, possibly
// huge) is only walked when it can still win, and its first step comes from the cached
// best successor instead of a scan.
//
// max_occurrences (K) bounds the work on repetitive text: a set is walked from its K
// most recently appended occurrences. E2 comes oldest first, so its occurrences are
// matched newest first, and the scan stops once K of them match the whole context (every
// set's newest K are then among those scanned). The one-token pattern's first step still
// counts all of E1 (cached); its walk goes on from the newest K of the two-token string.
// max_scan (M >= K) bounds the scan itself: patterns of two tokens and more are looked for
// among the newest M occurrences of the context's last two tokens only (without it the
// scan covers every occurrence of a frequent bigram whose longer matches are few).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "suffix_index.hpp"

namespace hvd {

enum Tree : int { NO_TREE = 0, LOCAL = 1, GLOBAL = 2 };

struct Config {
    int max_depth = 64;
    int max_spec_tokens = 64;
    double max_spec_factor = 1.0;
    double max_spec_offset = 0.0;
    double min_token_prob = 0.1;
    int64_t global_max_tokens = 2000000;
    int64_t max_occurrences = 1024;
    int64_t max_scan = 4096;  // >= max_occurrences (DrafterConfig.scan_limit ensures it)

    int budget(int p) const {
        // int() of the Python reference truncates toward zero, as the C++ cast does.
        int by_factor = static_cast<int>(p * max_spec_factor + max_spec_offset + 1e-6);
        return std::max(0, std::min({max_spec_tokens, by_factor, max_depth - p}));
    }
};

struct Draft {
    std::vector<int32_t> tokens;
    std::vector<double> probs;
    std::vector<int64_t> child_counts;
    double score = 0.0;
    int match_len = 0;
    int64_t match_count = 0;
    int tree = NO_TREE;
};

// A tree draft (sglang_hvd/drafter/protocol.py DraftTree): nodes in the order chosen
// best-first, parents[i] the index of node i's parent (-1: under the matched pattern).
struct TreeDraft : Draft {
    std::vector<int32_t> parents;

    int depth() const {
        std::vector<int> depths(parents.size());
        int deepest = 0;
        for (size_t i = 0; i < parents.size(); ++i) {
            depths[i] = parents[i] < 0 ? 1 : depths[static_cast<size_t>(parents[i])] + 1;
            deepest = std::max(deepest, depths[i]);
        }
        return deepest;
    }
};

// The occurrence set a chain draft was walked from (``Searcher::best`` keeps its winner's):
// a tree of the chain's own set grows from it without looking the set up again
// (``Searcher::tree_of``: the same nodes as ``best_tree`` with only_p = the chain's match length;
// its match length may be longer, as the chain's set scan stops early: row trees drop it).
struct ChainSet {
    bool valid = false;
    bool one_token = false;  // the one-token pattern's set E1 (its first level from the successor table)
    int32_t last = 0;        // (one_token) the context's last token
    int p_lo = 0, p_hi = 0, limit = 0;
    int64_t walked = 0;          // the set's size (a draft's match_count)
    std::vector<int64_t> ends;   // (not one_token) its occurrences' ends, in any order
};

class Searcher {
public:
    explicit Searcher(const Config& c) : cfg_(c) {
        budgets_.resize(c.max_depth + 1);
        for (int p = 0; p <= c.max_depth; ++p) budgets_[p] = c.budget(p);
        most_upto_.resize(c.max_depth + 1);
        for (int p = 0, most = 0; p <= c.max_depth; ++p) most_upto_[p] = most = std::max(most, budgets_[p]);
    }

    // ctx: the context's last min(len, max_depth) tokens. The winner's occurrence set is kept
    // (``take_chain_set``). ``floor``: a score the caller already holds (another tree's draft,
    // which wins ties): only a draft scoring more is looked for, and none (empty, score 0) is
    // returned when no set can beat it. Sets and walks that cannot are cut short; the draft that
    // does beat it is the one a search without a floor returns.
    Draft best(Index& ix, const int32_t* ctx, int n, int tree, double floor = 0.0) {
        chain_set_.valid = false;
        Draft d = search<Draft>(ix, ctx, n, tree, 0, 0, floor);
        if (d.tokens.empty()) d.score = 0.0;
        return d;
    }

    // The occurrence set of the last ``best``'s draft (valid false: it found none).
    ChainSet take_chain_set() { return std::move(chain_set_); }

    // The tree of at most max_nodes nodes grown from a chain's own set: what best_tree(ix, ctx,
    // n, tree, max_nodes, chain.match_len) returns, for the index and context ``set`` came from.
    TreeDraft tree_of(Index& ix, const ChainSet& set, int tree, int max_nodes) {
        TreeDraft best;
        if (max_nodes < 1 || !set.valid || std::min(set.limit, max_nodes) <= 0) return best;
        TreeDraft d;
        if (set.one_token) {
            const int64_t e1_count = ix.count(set.last);
            grow(ix, set.limit, max_nodes, d, [&](auto&& push) { seed_one_token(ix, set.last, e1_count, push); });
        } else {
            grow(ix, set.limit, max_nodes, d,
                 [&](auto&& push) { push_children(ix, set.ends.data(), set.ends.size(), -1, 1.0, 1, push); });
        }
        consider(d, set.walked, set.p_lo, set.p_hi, tree, best);
        return best;
    }

    // The best tree of at most max_nodes nodes: the same sets, bounds and tie rules;
    // only_p > 0: only from the set of the pattern length only_p (a chain's own set).
    // ``floor``: as best's.
    TreeDraft best_tree(Index& ix, const int32_t* ctx, int n, int tree, int max_nodes, int only_p = 0,
                        double floor = 0.0) {
        if (max_nodes < 1) return TreeDraft();
        TreeDraft d = search<TreeDraft>(ix, ctx, n, tree, max_nodes, only_p, floor);
        if (d.tokens.empty()) d.score = 0.0;
        return d;
    }

private:
    template <class Out>
    Out search(Index& ix, const int32_t* ctx, int n, int tree, int max_nodes, int only_p = 0, double floor = 0.0) {
        constexpr bool kTree = std::is_same_v<Out, TreeDraft>;
        // No draft of a set can score more than its depth budget (nor, for a tree, its
        // node budget: a level's path probabilities sum to at most 1).
        auto bound = [&](int limit) { return kTree ? std::min(limit, max_nodes) : limit; };
        Out best;
        best.score = floor;  // (tokens empty: best() reads it as no draft)
        int max_p = std::min(n, cfg_.max_depth) - 1;
        if (max_p < 1 || bound(most_upto_[max_p]) <= floor) return best;  // no set's draft can beat the floor
        const int32_t* arena = ix.arena();
        const int32_t last = ctx[n - 1];
        int64_t e1_count = ix.count(last);
        if (e1_count == 0) return best;
        const int32_t* rev = ctx + n - 1;  // rev[-j] = the context's (j+1)-th token from the end

        // the newest M of E2 (and all of E2's size: the pair's live count)
        const int64_t e2_count = ix.bigram_ends(rev[-1], last, ends_, cfg_.max_scan);
        bool merged = e2_count == e1_count;  // E2 == E1: lengths 1 and 2 share a set
        if (!ends_.empty()) {
            // Backward match length (>= 2, capped at max_p) of the occurrences, newest
            // first, until K of them match all max_p tokens: ends_[first:] are scanned.
            // Older ones cannot change a set's draft (its newest K), only how the lengths
            // split into sets; only_p asks for the set of one length, so it scans them all.
            const int64_t cap = cfg_.max_occurrences;
            match_.assign(ends_.size(), 0);
            int64_t full = 0;
            size_t first = ends_.size();
            while (first > 0 && (only_p > 0 || full < cap)) {
                --first;
                int64_t e = ends_[first];
                int b = 2;
                while (b < max_p && arena[e - b] == rev[-b]) ++b;
                match_[first] = std::min(b, max_p);
                full += match_[first] == max_p;
            }
            if (max_p < 2)
                for (size_t i = first; i < ends_.size(); ++i) match_[i] = max_p;
            // Longest match first; within a level, newest first (index order is stamp order):
            // a counting sort by level (levels 0..max_p), each level's indexes descending.
            level_at_.assign(static_cast<size_t>(max_p) + 2, 0);
            for (size_t i = first; i < ends_.size(); ++i) ++level_at_[static_cast<size_t>(match_[i])];
            for (int lv = max_p, at = 0; lv >= 0; --lv) {
                const int count = level_at_[static_cast<size_t>(lv)];
                level_at_[static_cast<size_t>(lv)] = at;
                at += count;
            }
            order_.resize(ends_.size() - first);
            for (size_t i = ends_.size(); i-- > first;)
                order_[static_cast<size_t>(level_at_[static_cast<size_t>(match_[i])]++)] = static_cast<int32_t>(i);
            // Distinct levels, longest first; the set of a level is a prefix of order_.
            size_t i = 0;
            while (i < order_.size()) {
                int level = match_[order_[i]];
                size_t j = i;
                while (j < order_.size() && match_[order_[j]] == level) ++j;
                int next_level = j < order_.size() ? match_[order_[j]] : (merged ? 0 : 1);
                int p_lo = next_level + 1, p_hi = level;
                size_t set_size = j;
                i = j;
                if (p_lo > p_hi) continue;  // (only when max_p < 2)
                if (only_p > 0 && (only_p < p_lo || only_p > p_hi)) continue;
                int p = best_length(p_lo, p_hi);
                int limit = budgets_[p];
                if (bound(limit) <= best.score) continue;
                // The set: the newest K of the scanned occurrences matching >= p_lo tokens.
                newest_.assign(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(set_size));
                if (static_cast<int64_t>(newest_.size()) > cap) {
                    std::nth_element(newest_.begin(), newest_.begin() + cap, newest_.end(), std::greater<int32_t>());
                    newest_.resize(static_cast<size_t>(cap));
                }
                cur_.clear();  // (in no particular order: a walk's and a tree's choices do not depend on it)
                for (int32_t k : newest_) cur_.push_back(ends_[k]);
                const int64_t walked = static_cast<int64_t>(cur_.size());
                Out& d = fresh<Out>();
                if constexpr (kTree) {
                    grow(ix, limit, max_nodes, d,
                         [&](auto&& push) { push_children(ix, cur_.data(), cur_.size(), -1, 1.0, 1, push); });
                    consider(d, walked, p_lo, p_hi, tree, best);
                } else {
                    walked_set_ = cur_;
                    // (narrows cur_)
                    if (walk(ix, cur_, limit, 1.0, d, best.score) && consider(d, walked, p_lo, p_hi, tree, best)) {
                        chain_set_.valid = true;
                        chain_set_.one_token = false;
                        chain_set_.p_lo = p_lo, chain_set_.p_hi = p_hi, chain_set_.limit = limit;
                        chain_set_.walked = walked;
                        chain_set_.ends.swap(walked_set_);
                    }
                }
            }
        }
        if (!merged && (only_p == 0 || only_p == 1)) {
            // The one-token pattern: its own set E1 (all occurrences of the last token).
            int limit = budgets_[1];
            if (bound(limit) > best.score) {
                int32_t tok;
                int64_t c;
                Out& d = fresh<Out>();
                if constexpr (kTree) {
                    grow(ix, limit, max_nodes, d, [&](auto&& push) { seed_one_token(ix, last, e1_count, push); });
                } else if (ix.best_successor(last, tok, c)) {
                    double prob = static_cast<double>(c) / static_cast<double>(e1_count);
                    if (prob >= cfg_.min_token_prob) {
                        d.tokens.push_back(tok);
                        d.probs.push_back(prob);
                        d.child_counts.push_back(c);
                        if (limit > 1 && !beaten(prob, limit - 1, prob, best.score)) {
                            ix.bigram_ends(last, tok, cur_, cfg_.max_occurrences);  // the newest K
                            if (!walk(ix, cur_, limit, prob, d, best.score)) d.tokens.clear();
                        }
                    }
                }
                if (consider(d, e1_count, 1, 1, tree, best) && !kTree) {
                    chain_set_.valid = chain_set_.one_token = true;
                    chain_set_.last = last;
                    chain_set_.p_lo = chain_set_.p_hi = 1, chain_set_.limit = limit;
                    chain_set_.walked = e1_count;
                    chain_set_.ends.clear();
                }
            }
        }
        return best;
    }

    // The one-token pattern's first tree level: all of E1 counted (the successor table); each
    // child's occurrences are fetched when it is expanded, the newest K of them.
    template <class Push>
    void seed_one_token(Index& ix, int32_t last, int64_t e1_count, Push&& push) {
        ix.successors(last, succ_buf_);
        for (auto& [t, count, newest] : succ_buf_) {
            double child = 1.0 * (static_cast<double>(count) / static_cast<double>(e1_count));
            if (child >= cfg_.min_token_prob) push(Front{child, 1, newest, t, -1, -1, count, last});
        }
    }

    int best_length(int lo, int hi) const {
        int best = lo;
        for (int q = lo + 1; q <= hi; ++q)
            if (budgets_[q] >= budgets_[best]) best = q;
        return best;
    }

    // d becomes best if it scores more (returns whether it did).
    template <class Out>
    bool consider(Out& d, int64_t set_size, int p_lo, int p_hi, int tree, Out& best) {
        if (d.tokens.empty()) return false;
        double score = 0.0;
        for (double p : d.probs) score += p;  // summed in order, as the reference does
        if (!(score > best.score)) return false;
        int depth;
        if constexpr (std::is_same_v<Out, TreeDraft>)
            depth = d.depth();
        else
            depth = static_cast<int>(d.tokens.size());
        int q = p_hi;
        while (q > p_lo && budgets_[q] < depth) --q;
        d.score = score;
        d.match_len = q;
        d.match_count = set_size;
        d.tree = tree;
        std::swap(best, d);  // d (a scratch draft) keeps the old best's buffers for the next walk
        return true;
    }

    // The index of token t's entry in a small table of continuations (``few_``, ``branches_``),
    // added if new; -1 when t is new and the table already holds kFewChildren entries.
    template <class Entry>
    static int small_slot(std::vector<Entry>& table, int32_t t) {
        size_t j = 0;
        while (j < table.size() && table[j].tok != t) ++j;
        if (j == table.size()) {
            if (j == kFewChildren) return -1;
            table.push_back(Entry{t});
        }
        return static_cast<int>(j);
    }

    // Whether a draft whose probabilities so far sum to `got`, with `left` tokens still to
    // come at path probability `prob` or less each (a path's probability never grows), can no
    // longer score more than `beat`. The margin covers the rounding of consider's sum.
    static bool beaten(double got, int left, double prob, double beat) {
        return got + left * prob < beat - 1e-9;
    }

    // Greedy walk from the occurrences `cur` (end positions, in any order: continuations are
    // counted, and ties go to the newest stamp), appending to d
    // until it holds `limit` tokens. `prob` is the path probability so far. Returns false,
    // d unfinished, once d can no longer score more than `beat` (consider would refuse it).
    bool walk(Index& ix, std::vector<int64_t>& cur, int limit, double prob, Draft& d, double beat) {
        const int32_t* arena = ix.arena();
        const int64_t* stamps = ix.stamps();
        double got = 0.0;  // d's score so far, summed in consider's order
        for (double q : d.probs) got += q;
        while (static_cast<int>(d.tokens.size()) < limit) {
            if (beaten(got, limit - static_cast<int>(d.tokens.size()), prob, beat)) return false;
            if (cur.size() == 1) {
                // One occurrence left: a literal copy at unchanged probability.
                if (prob < cfg_.min_token_prob) break;
                for (int64_t k = cur[0] + 1; static_cast<int>(d.tokens.size()) < limit && arena[k] >= 0; ++k) {
                    d.tokens.push_back(arena[k]);
                    d.probs.push_back(prob);
                    d.child_counts.push_back(1);
                }
                break;
            }
            // The children: each continuation's occurrences, counted in a small table while
            // they are few (the common case), else in a hash table. The best has the most
            // occurrences, then the newest stamp (unique per position): the same whatever the
            // order children are met in. Stamps are read only when children tie at the most.
            few_.clear();
            bool many = false;
            for (int64_t e : cur) {
                const int32_t t = arena[e + 1];
                if (t < 0) continue;
                const int j = small_slot(few_, t);
                if (j < 0) {
                    many = true;
                    break;
                }
                few_[static_cast<size_t>(j)].count += 1;
            }
            int32_t tok = -1;
            int64_t best_count = 0;
            int tied = 0;
            auto offer = [&](int32_t t, int64_t count) {
                if (count > best_count) {
                    tok = t;
                    best_count = count;
                    tied = 1;
                } else if (count == best_count) {
                    ++tied;
                }
            };
            if (!many) {
                for (const Kid& k : few_) offer(k.tok, k.count);
            } else {
                many_.reset();
                for (int64_t e : cur)
                    if (arena[e + 1] >= 0) many_[arena[e + 1]].count += 1;
                many_.for_each([&](int32_t t, const Kid& k) { offer(t, k.count); });
            }
            if (tok < 0) break;
            if (tied > 1) {  // the newest occurrence among the tied children's
                int64_t newest = -1;
                for (int64_t e : cur) {
                    const int32_t t = arena[e + 1];
                    if (t < 0 || stamps[e + 1] <= newest) continue;
                    int64_t count = 0;
                    if (many) {
                        count = many_.find(t)->count;
                    } else {
                        for (const Kid& k : few_)
                            if (k.tok == t) count = k.count;
                    }
                    if (count == best_count) {
                        newest = stamps[e + 1];
                        tok = t;
                    }
                }
            }
            prob *= static_cast<double>(best_count) / static_cast<double>(cur.size());
            if (prob < cfg_.min_token_prob) break;
            got += prob;
            d.tokens.push_back(tok);
            d.probs.push_back(prob);
            d.child_counts.push_back(best_count);
            size_t w = 0;
            for (int64_t e : cur)
                if (arena[e + 1] == tok) cur[w++] = e + 1;
            cur.resize(w);
        }
        return true;
    }

    // A frontier node of a tree: chosen by path probability, then the shallower, then the
    // more recently appended (as the chain walk breaks ties). `set` indexes spans_ (its
    // occurrences' ends); -1: a child of the one-token pattern, fetched when expanded.
    struct Front {
        double prob;
        int depth;
        int64_t stamp;
        int32_t tok;
        int32_t parent;
        int32_t set;
        int64_t count;
        int32_t prev;  // (set == -1) the token before it
    };
    struct Lower {
        bool operator()(const Front& a, const Front& b) const {
            if (a.prob != b.prob) return a.prob < b.prob;
            if (a.depth != b.depth) return a.depth > b.depth;
            return a.stamp < b.stamp;
        }
    };

    // Best-first growth: `seed(push)` pushes the first level; each chosen node pushes its
    // children while its depth is under `limit`, until `max_nodes` are chosen.
    template <class Seed>
    void grow(Index& ix, int limit, int max_nodes, TreeDraft& d, Seed&& seed) {
        if (limit < 1) return;
        d.tokens.reserve(static_cast<size_t>(max_nodes));
        d.parents.reserve(static_cast<size_t>(max_nodes));
        d.probs.reserve(static_cast<size_t>(max_nodes));
        d.child_counts.reserve(static_cast<size_t>(max_nodes));
        heap_.clear();
        pool_.clear();
        spans_.clear();
        auto push = [&](Front f) {
            heap_.push_back(f);
            std::push_heap(heap_.begin(), heap_.end(), Lower());
        };
        seed(push);
        while (!heap_.empty() && static_cast<int>(d.tokens.size()) < max_nodes) {
            std::pop_heap(heap_.begin(), heap_.end(), Lower());
            Front f = heap_.back();
            heap_.pop_back();
            const int32_t index = static_cast<int32_t>(d.tokens.size());
            d.tokens.push_back(f.tok);
            d.parents.push_back(f.parent);
            d.probs.push_back(f.prob);
            d.child_counts.push_back(f.count);
            if (f.depth >= limit) continue;
            if (f.set < 0) {  // a child of the one-token pattern: its newest K occurrences
                ix.bigram_ends(f.prev, f.tok, bigram_buf_, cfg_.max_occurrences);
                f.set = add_span(bigram_buf_.data(), bigram_buf_.size());
            }
            const auto [off, len] = spans_[static_cast<size_t>(f.set)];
            push_children(ix, pool_.data() + off, len, index, f.prob, f.depth + 1, push);
        }
    }

    // A growing tree's occurrence set: appended to pool_, its span's index returned.
    int32_t add_span(const int64_t* ends, size_t n) {
        spans_.emplace_back(pool_.size(), n);
        pool_.insert(pool_.end(), ends, ends + n);
        return static_cast<int32_t>(spans_.size() - 1);
    }

    // The children of a node whose n occurrences end at `occ` (any order), each with the
    // ends of its own occurrences (a span of pool_); those under the probability floor are
    // not pushed. `occ` may lie in pool_: it is read whole before pool_ grows.
    template <class Push>
    void push_children(Index& ix, const int64_t* occ, size_t n, int32_t parent, double prob, int depth, Push&& push) {
        const int32_t* arena = ix.arena();
        const int64_t* stamps = ix.stamps();
        // The continuations grouped by token: in a small table while they are few (the common
        // case), then through a hash map from token to branch; no sort. The children's order does
        // not matter: the frontier orders them by (probability, depth, newest stamp), and stamps
        // are unique; nor does the order of a span's ends.
        branches_.clear();
        if (cont_.size() < n) cont_.resize(n);  // (written by index: a push per occurrence was a call)
        size_t m = 0;  // cont_[:m] are this node's
        bool many = false;
        for (size_t k = 0; k < n; ++k) {
            const int64_t e = occ[k] + 1;
            const int32_t t = arena[e];
            if (t < 0) continue;
            int j = many ? -1 : small_slot(branches_, t);
            if (j < 0) {
                if (!many) {  // the small table is full: index its branches, and the rest, by token
                    many = true;
                    branch_of_.reset();
                    for (size_t b = 0; b < branches_.size(); ++b) branch_of_[branches_[b].tok].index = static_cast<int32_t>(b);
                }
                int32_t& slot = branch_of_[t].index;  // (-1: new)
                if (slot < 0) {
                    slot = static_cast<int32_t>(branches_.size());
                    branches_.push_back(Branch{t});
                }
                j = slot;
            }
            Branch& c = branches_[static_cast<size_t>(j)];
            c.count += 1;
            c.newest = std::max(c.newest, stamps[e]);
            cont_[m++] = {j, e};
        }
        const double total = static_cast<double>(n);
        size_t at = pool_.size();
        for (Branch& c : branches_) {
            c.prob = prob * (static_cast<double>(c.count) / total);
            c.fill = c.prob >= cfg_.min_token_prob ? at : SIZE_MAX;
            if (c.fill != SIZE_MAX) at += static_cast<size_t>(c.count);
        }
        pool_.resize(at);  // (occ is not read past this point: its ends were copied to cont_)
        for (size_t k = 0; k < m; ++k) {
            const auto [j, e] = cont_[k];
            Branch& c = branches_[static_cast<size_t>(j)];
            if (c.fill != SIZE_MAX) pool_[c.fill++] = e;
        }
        for (const Branch& c : branches_) {
            if (c.fill == SIZE_MAX) continue;
            const size_t start = c.fill - static_cast<size_t>(c.count);
            spans_.emplace_back(start, static_cast<size_t>(c.count));
            push(Front{c.prob, depth, c.newest, c.tok, parent, static_cast<int32_t>(spans_.size() - 1), c.count, -1});
        }
    }

    Config cfg_;
    std::vector<int> budgets_;
    std::vector<int> most_upto_;  // [p]: the largest budget of a pattern of at most p tokens
    std::vector<Front> heap_;
    std::vector<int64_t> pool_;                        // a growing tree's occurrence sets, one after another
    std::vector<std::pair<size_t, size_t>> spans_;     // each set's (offset, size) in pool_
    std::vector<int64_t> bigram_buf_;
    struct Branch {  // a node's continuation by one token (push_children's small table)
        int32_t tok = -1;
        int64_t count = 0;
        int64_t newest = -1;
        double prob = 0.0;
        size_t fill = 0;  // where its next end goes in pool_ (SIZE_MAX: under the floor, not kept)
    };
    std::vector<Branch> branches_;
    std::vector<std::pair<int32_t, int64_t>> cont_;  // (branch, end) of each occurrence with a continuation
    struct BranchIndex {  // a token's branch in branches_ (-1: none yet)
        int32_t index = -1;
    };
    FlatMap<int32_t, BranchIndex, -1> branch_of_;  // past kFewChildren branches: token -> branch
    std::vector<std::tuple<int32_t, int64_t, int64_t>> succ_buf_;
    std::vector<int64_t> ends_, cur_, walked_set_;
    ChainSet chain_set_;  // the occurrence set of best's winner so far (search<Draft>)
    // The drafts a search walks into, cleared for each set: their buffers are reused, not
    // allocated per set (a search considers several sets per row and step).
    Draft draft_scratch_;
    TreeDraft tree_scratch_;

    template <class Out>
    Out& fresh() {
        Out* d;
        if constexpr (std::is_same_v<Out, TreeDraft>) {
            d = &tree_scratch_;
            d->parents.clear();
        } else {
            d = &draft_scratch_;
            // a walk appends up to max_spec_tokens: room made once, not by doublings on every walk
            // (a winner's buffers leave with it, so a search's scratch may start empty)
            const size_t room = static_cast<size_t>(std::max(cfg_.max_spec_tokens, 0));
            d->tokens.reserve(room);
            d->probs.reserve(room);
            d->child_counts.reserve(room);
        }
        d->tokens.clear();
        d->probs.clear();
        d->child_counts.clear();
        d->score = 0.0;
        d->match_len = 0;
        d->match_count = 0;
        d->tree = NO_TREE;
        return *d;
    }
    std::vector<int> match_, level_at_;
    std::vector<int32_t> order_, newest_;
    struct Kid {
        int32_t tok = -1;
        int64_t count = 0;
    };
    static constexpr size_t kFewChildren = 16;  // children counted in a small table; more: in many_
    std::vector<Kid> few_;
    FlatMap<int32_t, Kid, -1> many_;
};

}  // namespace hvd
