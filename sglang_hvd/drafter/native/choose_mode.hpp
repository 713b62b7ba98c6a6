// The cost rule's pick of a step's mode, native: sglang_hvd/cost_rule.py's choose_mode (its
// numpy path, ``_choose_mode_numpy``, is the reference: the prices, the worked rules and the
// tie rules are there) with payoff.py's Payoff table built from the gate's survival curve or
// from its one predicted accept_len (the geometric model). A test holds the two equal on
// random batches. It shares the drafter's extension so that one build serves both.
//
// Sums follow numpy's pairwise summation (8 accumulators per block of 128) so that a mode's
// expected tokens are the numpy path's to the last bit: equal rates must go to the same mode.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "pairwise_sum.hpp"

namespace hvd {

enum ModeKind : int64_t { KIND_PLAIN = 0, KIND_CACHE_ONLY = 1, KIND_CHAIN = 2, KIND_TREE = 3 };
enum Control : int8_t { CTRL_AUTO = 0, CTRL_OFF = 1, CTRL_CACHE = 2, CTRL_EAGLE3 = 3 };

struct ModeInputs {
    int64_t b = 0;
    const double* predicted = nullptr;  // [b] the gate's accept_len (nan: no verdict); read without a curve
    const int32_t* lens = nullptr;      // [b] cache draft lengths
    const double* survival = nullptr;   // [b, w] the gate's curve, or null: the geometric model
    int64_t survival_width = 0;
    int64_t cap = 0;                    // the nodes the gate's accept_len was trained at
    const double* inverse = nullptr;    // payoff.GEOMETRIC_INVERSE [max_nodes + 1, fractions + 1]
    int64_t fractions = 0;
    int64_t max_nodes = 0;              // verify.MAX_TREE_NODES
    const int8_t* control = nullptr;    // [b] per-request controls, or null: every row auto
    int64_t eagle_reserve = 0;
    // the cost rule's tables (CostRule: modes in order)
    int64_t modes = 0;
    const int64_t* nodes = nullptr;     // [modes]
    const int64_t* kinds = nullptr;     // [modes]
    const double* floor = nullptr;      // [modes]
    const double* step_ms = nullptr;    // [modes] this batch's step time of each mode
    const int64_t* tree_modes = nullptr;  // [tree] the TREE modes' indexes
    int64_t tree = 0;
    const double* tree_beside = nullptr;  // [tree, beside]
    int64_t beside = 0;
};

struct ModePick {
    int64_t mode = 0;
    double expected = 0.0;
    bool per_row_reserve = false;  // a tree mode: reserve holds each row's
};

// Picks the mode; rows [b] (0/1) and, at a tree mode, reserve [b] are written.
inline ModePick choose_mode(const ModeInputs& in, uint8_t* rows, int32_t* reserve) {
    const int64_t b = in.b;
    int64_t widest = 0;
    for (int64_t m = 0; m < in.modes; ++m) widest = std::max(widest, in.nodes[m]);
    const int64_t width = std::min(widest, in.max_nodes);
    // acc[k * b + i]: row i's expected accepted tokens when k of its draft's tokens are checked (Payoff)
    std::vector<double> acc(static_cast<size_t>((width + 1) * b), 0.0);
    std::vector<double> first(static_cast<size_t>(b), 0.0);
    std::vector<int64_t> lens(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) lens[i] = std::min<int64_t>(std::max<int64_t>(in.lens[i], 0), in.max_nodes);
    if (in.survival != nullptr) {
        const int64_t w = in.survival_width, k_max = std::min(width, w);
        for (int64_t i = 0; i < b; ++i) {
            const double* s = in.survival + i * w;
            double low = std::numeric_limits<double>::infinity(), run = 0.0;
            for (int64_t k = 1; k <= width; ++k) {
                if (k <= k_max) {
                    low = std::min(low, s[k - 1]);
                    if (k <= lens[i]) run += low;
                }
                acc[k * b + i] = run;
            }
            first[i] = width ? acc[b + i] : 0.0;
        }
    } else {
        const int64_t f_cols = in.fractions + 1;
        for (int64_t i = 0; i < b; ++i) {
            const int64_t d = std::min(lens[i], in.cap);
            double f = in.predicted[i] / static_cast<double>(std::max<int64_t>(d, 1));
            f = std::isnan(f) ? 0.0 : std::min(std::max(f, 0.0), 1.0);  // np.fmin(np.fmax(., 0), 1): nan -> 0
            f *= static_cast<double>(in.fractions);
            const int64_t j = std::min(static_cast<int64_t>(f), in.fractions - 1);
            const double wt = f - static_cast<double>(j);
            const double p = d > 0 ? in.inverse[d * f_cols + j] * (1 - wt) + in.inverse[d * f_cols + j + 1] * wt : 0.0;
            first[i] = p;
            double power = p, run = 0.0;
            for (int64_t k = 1; k <= width; ++k) {
                if (k > 1) power *= p;
                if (k <= lens[i]) run += power;
                acc[k * b + i] = run;
            }
        }
    }
    auto accepted = [&](int64_t k, int64_t i) { return acc[std::min(k, width) * b + i]; };
    const bool controlled = in.control != nullptr;
    // per_row[m * b + i]: row i's tokens beyond the bonus at mode m (_all_modes)
    std::vector<double> per_row(static_cast<size_t>(in.modes * b));
    std::vector<double> best(static_cast<size_t>(in.tree * b), -std::numeric_limits<double>::infinity());
    std::vector<int64_t> best_c(static_cast<size_t>(in.tree * b), 1), share(static_cast<size_t>(in.tree * b));
    std::vector<int64_t> tree_of(static_cast<size_t>(in.modes), -1);
    for (int64_t t = 0; t < in.tree; ++t) tree_of[in.tree_modes[t]] = t;
    for (int64_t m = 0; m < in.modes; ++m) {
        const int64_t n = in.nodes[m];
        const int64_t t = tree_of[m];
        const double fl = in.floor[m];
        double* row = per_row.data() + m * b;
        const int64_t reserve_t = std::min(in.eagle_reserve, n - 1);
        for (int64_t i = 0; i < b; ++i) {
            const double chain = accepted(n, i);
            double v = std::max(chain, fl);
            if (t >= 0) {
                const int64_t sh = std::min<int64_t>(in.lens[i], n - reserve_t);
                share[t * b + i] = sh;
                double top = -std::numeric_limits<double>::infinity();
                int64_t top_c = 1;
                const double miss = 1.0 - first[i];
                for (int64_t c = 1; c <= in.beside && c <= sh; ++c) {
                    const double value = accepted(c, i) + miss * in.tree_beside[t * in.beside + c - 1];
                    if (value > top) {
                        top = value;
                        top_c = c;
                    }
                }
                best[t * b + i] = top;
                best_c[t * b + i] = top_c;
                v = std::max(top, fl);
            }
            if (controlled) {
                const int8_t c = in.control[i];
                if (c == CTRL_OFF) v = 0.0;
                else if (c == CTRL_CACHE) v = in.kinds[m] == KIND_PLAIN ? 0.0 : chain;
                else if (c == CTRL_EAGLE3) v = fl;
            }
            row[i] = v;
        }
    }
    ModePick pick;
    double top_rate = -std::numeric_limits<double>::infinity();
    for (int64_t m = 0; m < in.modes; ++m) {
        const double expected = static_cast<double>(b) + pairwise_sum(per_row.data() + m * b, b, 1);
        const double rate = expected / in.step_ms[m];
        if (m == 0 || rate > top_rate) {
            top_rate = rate;
            pick.mode = m;
            pick.expected = expected;
        }
    }
    const int64_t m = pick.mode, kind = in.kinds[m];
    for (int64_t i = 0; i < b; ++i) {
        const bool drafted = in.lens[i] > 0;
        bool use = false;
        if (kind == KIND_CACHE_ONLY) use = drafted;
        else if (kind == KIND_CHAIN) use = drafted && accepted(in.nodes[m], i) > in.floor[m];
        rows[i] = use;
    }
    if (kind == KIND_TREE) {
        const int64_t t = tree_of[m];
        pick.per_row_reserve = true;
        for (int64_t i = 0; i < b; ++i) {
            const bool use = in.lens[i] > 0 && best[t * b + i] > in.floor[m];
            rows[i] = use;
            const int64_t c = best_c[t * b + i];
            reserve[i] = static_cast<int32_t>(use && c < share[t * b + i] ? in.nodes[m] - c : in.eagle_reserve);
        }
    }
    return pick;
}

}  // namespace hvd
