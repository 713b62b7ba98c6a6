// The native cache drafter: one Index per running request (prompt + output) and one
// global Index (a document per response, running or finished; the oldest finished ones
// are evicted past the token budget). Mirrors sglang_hvd/drafter/suffix_drafter.py.
//
// A batch's rows are drafted on ``threads`` threads (pool.hpp), each with a searcher of its own:
// a row's search only reads the indexes (their two lazy repairs are locked: suffix_index.hpp)
// and writes only its own kept chain, so the drafts are the same on any number of threads.
#pragma once

#include <deque>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "pool.hpp"
#include "reaper.hpp"
#include "suffix_index.hpp"
#include "row_tree.hpp"
#include "suffix_search.hpp"

namespace hvd {

class SuffixDrafter {
public:
    explicit SuffixDrafter(const Config& c, int threads = 1)
        : cfg_(c), global_(c.max_depth), pool_(threads) {
        for (int w = 0; w < pool_.size(); ++w) searchers_.emplace_back(c);
    }

    int threads() const { return pool_.size(); }

    // fn(i, w) for each row i of a batch of running requests (w: the thread; its searcher drafts
    // the row: speculated(reqs[i], w), speculate_row(reqs[i], n, w)), in order on this thread
    // unless the pool has workers and the batch kMinParallelRows rows. On the pool, checked
    // first on this thread: every request is running (else out_of_range, nothing drafted); a
    // batch naming a request twice runs on this thread alone (its rows would write one kept chain).
    template <class Fn>
    void for_rows(const int64_t* reqs, int64_t n, Fn&& fn) {
        auto inline_rows = [&] {
            for (int64_t i = 0; i < n; ++i) fn(i, 0);
        };
        if (pool_.size() == 1 || n < kMinParallelRows) return inline_rows();
        for (int64_t i = 0; i < n; ++i) {
            running(reqs[i]);
            last_chain_[reqs[i]];  // its slot made here: the rows only find theirs
        }
        std::vector<int64_t> ids(reqs, reqs + n);
        std::sort(ids.begin(), ids.end());
        if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return inline_rows();
        pool_.run(n, fn);
    }

    void reset() {
        changed();
        last_chain_.clear();
        local_.clear();
        recent_.clear();
        global_ = Index(cfg_.max_depth);
        finished_.clear();
        finished_set_.clear();
        evicted_ = 0;
    }

    void start(int64_t req, const int32_t* prompt, int64_t n) {
        if (local_.count(req)) throw std::invalid_argument("request is already running");
        changed();
        if (finished_set_.count(req)) {  // a reused id replaces its old cached response
            finished_set_.erase(req);
            finished_.erase(std::find(finished_.begin(), finished_.end(), req));
            global_.remove_doc(req);
        }
        local_[req] = local_index_for(prompt, n);
        global_.add_doc(req, nullptr, 0, 64);
    }

    void append(int64_t req, const int32_t* tokens, int64_t n) {
        Index& own = running(req);
        changed();
        own.extend(0, tokens, n);
        global_.extend(req, tokens, n);
        if (global_.num_live() > cfg_.global_max_tokens) evict();
    }

    void finish(int64_t req) {
        running(req);
        changed();
        last_chain_.erase(req);
        // Keep the request's own index for a while: the next turn of the same conversation
        // re-sends this context as its prompt prefix, and re-indexing it is the main cost.
        recent_.push_front(std::move(local_[req]));
        if (recent_.size() > kRecentIndexes) {  // the oldest is freed off this thread (reaper.hpp)
            reaper_.drop(std::move(recent_.back()));
            recent_.pop_back();
        }
        local_.erase(req);
        finished_.push_back(req);
        finished_set_.insert(req);
        evict();
    }

    Draft speculate(int64_t req) { return speculated(req); }

    // The request's chain draft, as kept for its row tree (valid until the next change or search),
    // drafted by thread w's searcher.
    const Draft& speculated(int64_t req, int w = 0) {
        Searcher& search = searchers_[static_cast<size_t>(w)];
        Index& own = running(req);
        const Index::Doc& d = own.doc(0);
        int n = static_cast<int>(std::min<int64_t>(d.len, cfg_.max_depth));
        const int32_t* tail = own.arena() + d.start + d.len - n;
        Draft a = search.best(own, tail, n, LOCAL);
        ChainSet set_a = search.take_chain_set();
        // the global draft is only taken if it scores more than the local one: no set or walk
        // that cannot is searched
        Draft b = search.best(global_, tail, n, GLOBAL, a.score);
        const bool local = a.score >= b.score;
        auto slot = last_chain_.find(req);  // (made by for_rows for a batch's rows)
        Chain& kept = slot != last_chain_.end() ? slot->second : last_chain_[req];
        kept.epoch = epoch_;
        kept.draft = local ? std::move(a) : std::move(b);
        kept.set = local ? std::move(set_a) : search.take_chain_set();
        return kept.draft;
    }

    // The best tree of at most max_nodes nodes; with only_tree (LOCAL or GLOBAL) and only_p,
    // the tree of that one occurrence set (a chain draft's own: its tree and match length).
    TreeDraft speculate_tree(int64_t req, int max_nodes, int only_tree = NO_TREE, int only_p = 0) {
        Searcher& search = searchers_[0];
        Index& own = running(req);
        const Index::Doc& d = own.doc(0);
        int n = static_cast<int>(std::min<int64_t>(d.len, cfg_.max_depth));
        const int32_t* tail = own.arena() + d.start + d.len - n;
        if (only_tree == LOCAL) return search.best_tree(own, tail, n, LOCAL, max_nodes, only_p);
        if (only_tree == GLOBAL) return search.best_tree(global_, tail, n, GLOBAL, max_nodes, only_p);
        TreeDraft a = search.best_tree(own, tail, n, LOCAL, max_nodes);
        TreeDraft b = search.best_tree(global_, tail, n, GLOBAL, max_nodes, 0, a.score);  // (as speculated)
        return a.score >= b.score ? a : b;
    }

    // The row tree (row_tree.hpp) from the chain and the tree draft of the chain's own
    // occurrence set (max_nodes nodes); none without a chain (a row tree extends a chain). A
    // certain chain (path probability 1 at every token), or one of max_nodes tokens or more, is
    // its own row: no tree is grown.
    RowTree speculate_row(int64_t req, int max_nodes, int w = 0) {
        const Chain& kept = kept_chain(req, w);
        const Draft& chain = kept.draft;
        if (chain.tokens.empty()) return RowTree{};
        // a certain chain, or one that fills the row: the row holds none of the tree's nodes
        if (chain.probs.back() >= 1.0 || static_cast<int>(chain.tokens.size()) >= max_nodes)
            return row_tree(chain, TreeDraft{}, max_nodes);
        // the tree of the chain's own set (speculate_tree(req, max_nodes, chain.tree, chain.match_len)),
        // grown from the set the chain's search found
        Index& ix = chain.tree == LOCAL ? running(req) : global_;
        return row_tree(chain, searchers_[static_cast<size_t>(w)].tree_of(ix, kept.set, chain.tree, max_nodes),
                        max_nodes);
    }

    std::vector<int32_t> context(int64_t req) {
        Index& own = running(req);
        const Index::Doc& d = own.doc(0);
        return std::vector<int32_t>(own.arena() + d.start, own.arena() + d.start + d.len);
    }

    bool is_running(int64_t req) const { return local_.count(req) != 0; }
    int64_t global_tokens() const { return global_.num_live(); }
    int64_t local_tokens() const {
        int64_t n = 0;
        for (auto& [k, ix] : local_) n += ix->num_live();
        return n;
    }
    size_t nbytes() const {
        size_t b = global_.nbytes();
        for (auto& [k, ix] : local_) b += ix->nbytes();
        return b;
    }
    int64_t evicted() const { return evicted_; }
    int64_t compactions() const { return global_.num_compactions(); }
    const Config& config() const { return cfg_; }

    int64_t reused_prompt_tokens() const { return reused_tokens_; }
    size_t pending_frees() { return reaper_.pending(); }  // indexes dropped, not yet freed

private:
    static constexpr size_t kRecentIndexes = 16;
    // Fewer rows are drafted on the calling thread (on a 2-vCPU VM 16 rows on two threads lost ~6%).
    static constexpr int64_t kMinParallelRows = 32;

    struct Chain {
        uint64_t epoch = 0;
        Draft draft;
        ChainSet set;  // the occurrence set draft was walked from
    };

    // The request's chain and the occurrence set it was walked from: the one speculate
    // returned, while nothing has changed since (a step's speculate_batch, then its row
    // trees); else a new search.
    Chain& kept_chain(int64_t req, int w) {
        auto it = last_chain_.find(req);
        if (it == last_chain_.end() || it->second.epoch != epoch_) {
            speculated(req, w);
            it = last_chain_.find(req);
        }
        return it->second;
    }

    // A request's own index: a recently finished one sharing a long prefix with the prompt,
    // cut back to that prefix and extended; else a fresh one. Either holds exactly the
    // prompt, with stamps increasing along it, so drafts are the same as from a fresh index.
    std::unique_ptr<Index> local_index_for(const int32_t* prompt, int64_t n) {
        size_t best = recent_.size();
        int64_t best_lcp = 0;
        for (size_t k = 0; k < recent_.size(); ++k) {
            const Index::Doc& d = recent_[k]->doc(0);
            const int32_t* old = recent_[k]->arena() + d.start;
            int64_t m = std::min(n, d.len), l = 0;
            while (l < m && old[l] == prompt[l]) ++l;
            if (l > best_lcp) { best_lcp = l; best = k; }
        }
        if (best < recent_.size() && best_lcp >= 256 && 2 * best_lcp >= n) {
            std::unique_ptr<Index> ix = std::move(recent_[best]);
            recent_.erase(recent_.begin() + static_cast<std::ptrdiff_t>(best));
            ix->truncate_doc(0, best_lcp);
            ix->extend(0, prompt + best_lcp, n - best_lcp);
            reused_tokens_ += best_lcp;
            return ix;
        }
        auto ix = std::make_unique<Index>(cfg_.max_depth);
        ix->add_doc(0, prompt, n, 256);
        return ix;
    }

    Index& running(int64_t req) {
        auto it = local_.find(req);
        if (it == local_.end()) throw std::out_of_range("request is not running (start_request first)");
        return *it->second;
    }

    // Every change to an index (drafts may differ after it) ends the chains remembered.
    void changed() { ++epoch_; }

    void evict() {
        while (global_.num_live() > cfg_.global_max_tokens && !finished_.empty()) {
            int64_t oldest = finished_.front();
            finished_.pop_front();
            finished_set_.erase(oldest);
            global_.remove_doc(oldest);
            evicted_ += 1;
        }
    }

    Config cfg_;
    std::vector<Searcher> searchers_;  // one per thread of pool_
    Index global_;
    std::unordered_map<int64_t, std::unique_ptr<Index>> local_;
    std::deque<std::unique_ptr<Index>> recent_;  // finished requests' own indexes, newest first
    int64_t reused_tokens_ = 0;
    std::deque<int64_t> finished_;
    std::unordered_set<int64_t> finished_set_;
    int64_t evicted_ = 0;
    uint64_t epoch_ = 0;  // bumped by every change (changed())
    std::unordered_map<int64_t, Chain> last_chain_;  // running request -> its chain at an epoch
    Reaper<Index> reaper_;  // frees the indexes recent_ lets go of
    Pool pool_;             // the threads a batch's rows are drafted on (for_rows)
};

}  // namespace hvd
