// The cache row's tree: the chain draft first, then the tree draft's other nodes in its
// order (sglang_hvd/drafter/row_tree.py row_tree, the reference; same result).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "suffix_search.hpp"

namespace hvd {

struct RowTree {
    std::vector<int32_t> tokens;
    std::vector<int32_t> parents;  // -1: under the root
    std::vector<double> probs;     // path probability: the chain's for its nodes, the tree's for the others
};

inline RowTree row_tree(const Draft& chain, const TreeDraft& tree, int max_nodes) {
    RowTree row;
    row.tokens.reserve(static_cast<size_t>(max_nodes));
    row.parents.reserve(static_cast<size_t>(max_nodes));
    row.probs.reserve(static_cast<size_t>(max_nodes));
    const int cut = std::min(static_cast<int>(chain.tokens.size()), max_nodes);
    row.tokens.assign(chain.tokens.begin(), chain.tokens.begin() + cut);
    row.probs.assign(chain.probs.begin(), chain.probs.begin() + cut);
    for (int k = 0; k < cut; ++k) row.parents.push_back(k - 1);
    const size_t n = tree.tokens.size();
    std::vector<int> depth(n), placed(n, -1);  // placed: the row node a tree node became (-1: none)
    std::vector<char> on_chain(n);
    for (size_t i = 0; i < n; ++i) {
        const int p = tree.parents[i];
        const int d = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
        const bool chained = (p < 0 || on_chain[static_cast<size_t>(p)]) && d <= cut &&
                             row.tokens[static_cast<size_t>(d - 1)] == tree.tokens[i];
        depth[i] = d;
        on_chain[i] = chained;
        if (chained) {
            placed[i] = d - 1;
        } else if (static_cast<int>(row.tokens.size()) < max_nodes && (p < 0 || placed[static_cast<size_t>(p)] >= 0)) {
            placed[i] = static_cast<int>(row.tokens.size());
            row.tokens.push_back(tree.tokens[i]);
            row.parents.push_back(p < 0 ? -1 : placed[static_cast<size_t>(p)]);
            row.probs.push_back(tree.probs[i]);
        }
    }
    return row;
}

}  // namespace hvd
