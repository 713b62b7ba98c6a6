// The gate's features of a batch, native: the match, position, history and token groups
// of sglang_hvd/features.py (FeatureExtractor.features, whose numpy path is the reference:
// the names, the order and the worked examples are there). Every value is computed in
// double and rounded once to float, as the reference does; the tree group (features.tree_features,
// the reference) by ``tree_features``. It shares the drafter's extension so that one build
// serves both.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "pairwise_sum.hpp"

namespace hvd {

struct FeatureInputs {
    int64_t b = 0;
    int64_t width = 0;             // draft columns W
    const int32_t* tokens;         // [b, W], -1 padded
    const double* probs;           // [b, W]
    const int64_t* child_counts;   // [b, W]
    const int32_t* lengths;        // [b]
    const int32_t* match_len;      // [b]
    const int64_t* match_count;    // [b]
    const double* score;           // [b]
    const int32_t* tree;           // [b]
    int32_t local_code = 1;        // the tree code of a draft from the request's own index
    const double* pos;             // [b] output tokens so far
    const double* prompt_len;      // [b]
    const float* history;          // [b, num_history]
    int64_t num_history = 0;
    const int64_t* tails;          // [b, tail_tokens], -1 padded
    const int64_t* tail_lens;      // [b]
    int64_t tail_tokens = 0;
    const uint8_t* flags;          // [vocab + 1, num_flags] 0/1; the last row all zero
    int64_t vocab = 0;
    int64_t num_flags = 0;
    const float* budgets;          // [num_budgets] the length budget by match length
    int64_t num_budgets = 0;
};

// Columns [0, 14 + num_history + 3 * num_flags) of out ([b, out_cols] float, row-major);
// the rest (the tree group) is left as it is.
inline void gate_features(const FeatureInputs& in, float* out, int64_t out_cols) {
    const int64_t w = in.width;
    int64_t longest = 1;  // the token groups read the first max(longest draft, 1) columns, as the reference
    for (int64_t i = 0; i < in.b; ++i) longest = std::max<int64_t>(longest, in.lengths[i]);
    longest = std::min(longest, w);
    const int64_t nf = in.num_flags;
    auto flag_row = [&](int64_t id) -> const uint8_t* {
        const int64_t r = (id < 0 || id >= in.vocab) ? in.vocab : id;  // beyond the vocab, and padding: none
        return in.flags + r * nf;
    };
    for (int64_t i = 0; i < in.b; ++i) {
        float* o = out + i * out_cols;
        const int64_t n = in.lengths[i];
        const int64_t last = std::max<int64_t>(n - 1, 0);
        const double safe_n = static_cast<double>(std::max<int64_t>(n, 1));
        const int32_t* t = in.tokens + i * w;
        const double* p = in.probs + i * w;
        const int64_t* c = in.child_counts + i * w;
        double f[14];
        if (n > 0) {
            f[0] = static_cast<double>(n);
            f[1] = static_cast<double>(in.match_len[i]);
            f[2] = in.tree[i] == in.local_code ? 1.0 : 0.0;
            f[3] = in.score[i];
            f[4] = in.score[i] / safe_n;
            f[5] = w ? p[0] : 0.0;
            f[6] = w ? p[last] : 0.0;
            f[7] = std::log1p(static_cast<double>(in.match_count[i]));
            f[8] = std::log1p(static_cast<double>(w ? c[0] : 0));
            f[9] = std::log1p(static_cast<double>(w ? c[last] : 0));
            const int64_t m = std::min<int64_t>(in.match_len[i], in.num_budgets - 1);
            const float budget = std::max(in.budgets[m], 1.0f);
            f[10] = static_cast<double>(n) / static_cast<double>(budget);
        } else {
            std::fill(f, f + 11, 0.0);  // no draft: no match group
        }
        f[11] = std::log1p(in.pos[i]);
        f[12] = std::log1p(in.prompt_len[i]);
        f[13] = in.pos[i] / std::max(in.pos[i] + in.prompt_len[i], 1.0);
        for (int k = 0; k < 14; ++k) o[k] = static_cast<float>(f[k]);
        const float* h = in.history + i * in.num_history;
        std::copy(h, h + in.num_history, o + 14);
        float* first = o + 14 + in.num_history;
        float* mean = first + nf;
        float* tail = mean + nf;
        const uint8_t* f0 = flag_row(w ? t[0] : -1);
        for (int64_t k = 0; k < nf; ++k) first[k] = static_cast<float>(f0[k]);
        // counts of each flag (exact), then one division each, in double
        int64_t sums[64] = {0};
        for (int64_t j = 0; j < longest; ++j) {
            const uint8_t* r = flag_row(t[j]);
            for (int64_t k = 0; k < nf; ++k) sums[k] += r[k];
        }
        for (int64_t k = 0; k < nf; ++k) mean[k] = static_cast<float>(static_cast<double>(sums[k]) / safe_n);
        std::fill(sums, sums + 64, 0);
        const int64_t* tt = in.tails + i * in.tail_tokens;
        for (int64_t j = 0; j < in.tail_tokens; ++j) {
            const uint8_t* r = flag_row(tt[j]);
            for (int64_t k = 0; k < nf; ++k) sums[k] += r[k];
        }
        const double tail_n = static_cast<double>(std::max<int64_t>(in.tail_lens[i], 1));
        for (int64_t k = 0; k < nf; ++k) tail[k] = static_cast<float>(static_cast<double>(sums[k]) / tail_n);
    }
}

// The tree group (features.tree_features, the reference): row i's row tree of w nodes
// (parents, path probs, row-major), its chain of chain_lens[i] nodes, the first num_nodes[i]
// nodes verified; five values into out[i * out_cols + col ...]. Sums are numpy's pairwise
// sums over all w nodes (those off the siblings add 0), so the values are the reference's.
inline void tree_features(int64_t b, int64_t w, const int32_t* parents, const double* probs, const int32_t* chain_lens,
                          const int32_t* num_nodes, float* out, int64_t out_cols, int64_t col) {
    std::vector<double> mass(static_cast<size_t>(w)), root(static_cast<size_t>(w));
    std::vector<uint8_t> hangs(static_cast<size_t>(w) + 1);
    for (int64_t i = 0; i < b; ++i) {
        const int64_t limit = std::min<int64_t>(num_nodes[i], w);
        const int64_t chain = std::min<int64_t>(chain_lens[i], limit);
        const int32_t* par = parents + i * w;
        const double* pr = probs + i * w;
        double best = 0.0;
        std::fill(hangs.begin(), hangs.end(), 0);
        int64_t points = 0;
        for (int64_t k = 0; k < w; ++k) {
            const bool sib = chain <= k && k < limit;
            mass[k] = sib ? pr[k] : 0.0;
            root[k] = sib && par[k] < 0 ? pr[k] : 0.0;
            best = std::max(best, mass[k]);
            if (sib && par[k] < chain && !hangs[par[k] + 1]) {
                hangs[par[k] + 1] = 1;
                ++points;
            }
        }
        float* o = out + i * out_cols + col;
        o[0] = static_cast<float>(limit - chain);
        o[1] = static_cast<float>(pairwise_sum(mass.data(), w, 1));
        o[2] = static_cast<float>(pairwise_sum(root.data(), w, 1));
        o[3] = static_cast<float>(best);
        o[4] = static_cast<float>(points);
    }
}

}  // namespace hvd
