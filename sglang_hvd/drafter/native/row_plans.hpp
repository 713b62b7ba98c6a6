// A step's row plans, native: decision.py's ``_row_plans_numpy`` (the reference, with the
// rules: plan_rows, the row trees that grow cache rows, the per-request controls) in one
// pass over the rows, for the served path, whose row trees are made before the decision.
// A test holds the two equal on random batches. It shares the drafter's extension.
#pragma once

#include <algorithm>
#include <cstdint>

#include "choose_mode.hpp"  // Control

namespace hvd {

struct RowPlanInputs {
    int64_t b = 0;
    int64_t n = 0;                          // the tier's draft nodes (N-1)
    bool branches = false;                  // the tier allows branches (topk > 1)
    bool eagle3 = true;                     // the step runs EAGLE3's draft: rows keep its nodes
    const uint8_t* use = nullptr;           // [b] the rows that verify their cache draft
    const int32_t* lens = nullptr;          // [b] cache draft lengths
    int64_t reserve = 0;                    // EAGLE3 nodes kept beside a cache draft: one for all rows,
    const int32_t* reserve_rows = nullptr;  // or [b] one per row
    const int32_t* draft_tokens = nullptr;  // [b, width] the chains, -1 padded
    int64_t width = 0;
    // the row trees that grow cache rows (null: none), as made for the step's shape:
    const int32_t* tree_tokens = nullptr;   // [b, tree_width]
    const int32_t* tree_parents = nullptr;  // [b, tree_width]
    const int32_t* tree_lengths = nullptr;  // [b]
    int64_t tree_width = 0;                 // the shape's N-1 nodes (>= n)
    int64_t siblings = 0;                   // tree nodes a cache row may add to its chain: one for all rows,
    const int32_t* siblings_rows = nullptr;  // or [b] one per row
    const int8_t* control = nullptr;        // [b] per-request controls, or null: every row auto
};

// Fills cache[b], eagle[b], tokens[b, n] and parents[b, n].
inline void row_plans(const RowPlanInputs& in, int32_t* cache, int32_t* eagle, int32_t* tokens, int32_t* parents) {
    const int64_t n = in.n, copy = std::min(in.width, n);
    for (int64_t i = 0; i < in.b; ++i) {
        const int64_t len = in.lens[i];
        const int64_t r = in.reserve_rows ? in.reserve_rows[i] : in.reserve;
        const int64_t keep = in.branches ? std::min(r, n - 1) : 0;  // EAGLE3's nodes kept beside the cache branch
        int64_t c = in.use[i] ? std::min(len, n - keep) : 0;
        int64_t e = in.branches ? n - c : (c > 0 ? 0 : n);
        int32_t* tok = tokens + i * n;
        int32_t* par = parents + i * n;
        const int32_t* grown = nullptr;  // the row's tree, where it grows the row
        const int64_t sib = in.siblings_rows ? in.siblings_rows[i] : in.siblings;
        if (in.tree_tokens && in.branches && in.use[i] && sib > 0 && c < n - keep) {
            // the row tree's first nodes, up to the nodes the decision describes (its chain and
            // its siblings), the tree's own and the cache branch's share
            c = std::min({len + sib, n, static_cast<int64_t>(in.tree_lengths[i]), n - keep});
            e = n - c;
            grown = in.tree_tokens + i * in.tree_width;
            std::copy(grown, grown + n, tok);
            std::copy(in.tree_parents + i * in.tree_width, in.tree_parents + i * in.tree_width + n, par);
        }
        if (!grown) {
            const int32_t* d = in.draft_tokens + i * in.width;
            std::copy(d, d + copy, tok);
            std::fill(tok + copy, tok + n, -1);
            for (int64_t k = 0; k < n; ++k) par[k] = static_cast<int32_t>(k - 1);
        }
        if (!in.eagle3 || (in.control && (in.control[i] == CTRL_OFF || in.control[i] == CTRL_CACHE))) e = 0;
        cache[i] = static_cast<int32_t>(c);
        eagle[i] = static_cast<int32_t>(e);
    }
}

}  // namespace hvd
