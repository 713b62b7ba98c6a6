// Python bindings of the native drafter (pybind11). Batch calls release the GIL and
// return numpy arrays: no per-token Python objects on the serving path. The native
// decision state (request_state.hpp), the gate's features (features.hpp) and the cost
// rule's pick (choose_mode.hpp) and the row plans (row_plans.hpp) are bound here too: one extension, one build.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "choose_mode.hpp"
#include "features.hpp"
#include "request_state.hpp"
#include "row_plans.hpp"
#include "suffix_drafter.hpp"

namespace py = pybind11;
using hvd::Config;
using hvd::Draft;
using hvd::SuffixDrafter;

using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using U8 = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

static py::tuple draft_tuple(const Draft& d) {
    // Plain Python tuples: one request's draft is short, and replay builds a Draft from them.
    py::tuple tokens(d.tokens.size()), probs(d.probs.size()), counts(d.child_counts.size());
    for (size_t i = 0; i < d.tokens.size(); ++i) {
        tokens[i] = py::int_(d.tokens[i]);
        probs[i] = py::float_(d.probs[i]);
        counts[i] = py::int_(d.child_counts[i]);
    }
    return py::make_tuple(tokens, probs, counts, d.score, d.match_len, d.match_count, d.tree);
}

// A decode batch's chain drafts as arrays, made in ``out`` (with the GIL) and filled row by row
// (without it): tokens/probs/child_counts [B, w] (padded with -1 / 0 / 0), lengths, match_len,
// match_count, score, tree [B].
class DraftArrays {
public:
    DraftArrays(py::dict& out, py::ssize_t b, py::ssize_t w)
        : w_(w), tokens_({b, w}), probs_({b, w}), counts_({b, w}), lengths_(b), match_len_(b), tree_(b),
          match_count_(b), score_(b), T_(tokens_.mutable_unchecked<2>()), P_(probs_.mutable_unchecked<2>()),
          C_(counts_.mutable_unchecked<2>()), L_(lengths_.mutable_unchecked<1>()), M_(match_len_.mutable_unchecked<1>()),
          K_(match_count_.mutable_unchecked<1>()), S_(score_.mutable_unchecked<1>()), R_(tree_.mutable_unchecked<1>()) {
        out["tokens"] = tokens_;
        out["probs"] = probs_;
        out["child_counts"] = counts_;
        out["lengths"] = lengths_;
        out["match_len"] = match_len_;
        out["match_count"] = match_count_;
        out["score"] = score_;
        out["tree"] = tree_;
    }

    void put(py::ssize_t i, const Draft& d) {
        const py::ssize_t n = static_cast<py::ssize_t>(d.tokens.size());
        for (py::ssize_t k = 0; k < w_; ++k) {
            T_(i, k) = k < n ? d.tokens[k] : -1;
            P_(i, k) = k < n ? d.probs[k] : 0.0;
            C_(i, k) = k < n ? d.child_counts[k] : 0;
        }
        L_(i) = static_cast<int32_t>(n);
        M_(i) = d.match_len;
        K_(i) = d.match_count;
        S_(i) = d.score;
        R_(i) = d.tree;
    }

private:
    py::ssize_t w_;
    py::array_t<int32_t> tokens_;
    py::array_t<double> probs_;
    py::array_t<int64_t> counts_;
    py::array_t<int32_t> lengths_, match_len_, tree_;
    py::array_t<int64_t> match_count_;
    py::array_t<double> score_;
    py::detail::unchecked_mutable_reference<int32_t, 2> T_;
    py::detail::unchecked_mutable_reference<double, 2> P_;
    py::detail::unchecked_mutable_reference<int64_t, 2> C_;
    py::detail::unchecked_mutable_reference<int32_t, 1> L_, M_;
    py::detail::unchecked_mutable_reference<int64_t, 1> K_;
    py::detail::unchecked_mutable_reference<double, 1> S_;
    py::detail::unchecked_mutable_reference<int32_t, 1> R_;
};

// A batch's row trees as arrays, made and filled as DraftArrays: row_tokens/row_parents
// [B, max_nodes] (-1 padded), row_probs [B, max_nodes] (0 padded), row_lengths [B].
class RowArrays {
public:
    RowArrays(py::dict& out, py::ssize_t b, int max_nodes)
        : w_(max_nodes), tokens_({b, w_}), parents_({b, w_}), probs_({b, w_}), lengths_(b),
          T_(tokens_.mutable_unchecked<2>()), P_(parents_.mutable_unchecked<2>()), Q_(probs_.mutable_unchecked<2>()),
          L_(lengths_.mutable_unchecked<1>()) {
        out["row_tokens"] = tokens_;
        out["row_parents"] = parents_;
        out["row_probs"] = probs_;
        out["row_lengths"] = lengths_;
    }

    void put(py::ssize_t i, const hvd::RowTree& row) {
        const py::ssize_t n = static_cast<py::ssize_t>(row.tokens.size());
        for (py::ssize_t k = 0; k < w_; ++k) {
            T_(i, k) = k < n ? row.tokens[k] : -1;
            P_(i, k) = k < n ? row.parents[k] : -1;
            Q_(i, k) = k < n ? row.probs[k] : 0.0;
        }
        L_(i) = static_cast<int32_t>(n);
    }

private:
    py::ssize_t w_;
    py::array_t<int32_t> tokens_, parents_;
    py::array_t<double> probs_;
    py::array_t<int32_t> lengths_;
    py::detail::unchecked_mutable_reference<int32_t, 2> T_, P_;
    py::detail::unchecked_mutable_reference<double, 2> Q_;
    py::detail::unchecked_mutable_reference<int32_t, 1> L_;
};

// The draft side of the gate's features (features.hpp): the drafts' arrays, the flags and the
// budgets checked against one another and out; the states' columns are the caller's to set.
static hvd::FeatureInputs draft_features(py::array& out, I32& tokens, F64& probs, I64& child_counts, I32& lengths,
                                         I32& match_len, I64& match_count, F64& score, I32& tree, int32_t local_code,
                                         U8& flags, F32& budgets, int64_t num_history, const char* who) {
    if (!out.dtype().is(py::dtype::of<float>()) || !(out.flags() & py::array::c_style) || !out.writeable())
        throw std::invalid_argument(std::string(who) + ": out must be a writeable C-contiguous float32 array");
    const py::ssize_t b = lengths.shape(0);
    auto same_rows = [b](const py::array& a) { return a.ndim() >= 1 && a.shape(0) == b; };
    if (out.ndim() != 2 || !same_rows(out) || tokens.ndim() != 2 || !same_rows(tokens) || !same_rows(probs) ||
        !same_rows(child_counts) || probs.ndim() != 2 || child_counts.ndim() != 2 ||
        probs.shape(1) != tokens.shape(1) || child_counts.shape(1) != tokens.shape(1) || !same_rows(match_len) ||
        !same_rows(match_count) || !same_rows(score) || !same_rows(tree) || flags.ndim() != 2 ||
        flags.shape(0) < 1 || flags.shape(1) > 64 || budgets.shape(0) < 1)
        throw std::invalid_argument(std::string(who) + ": arrays of mismatched shapes");
    if (out.shape(1) < 14 + num_history + 3 * flags.shape(1))
        throw std::invalid_argument(std::string(who) + ": out has too few columns");
    hvd::FeatureInputs in;
    in.b = b;
    in.width = tokens.shape(1);
    in.tokens = tokens.data();
    in.probs = probs.data();
    in.child_counts = child_counts.data();
    in.lengths = lengths.data();
    in.match_len = match_len.data();
    in.match_count = match_count.data();
    in.score = score.data();
    in.tree = tree.data();
    in.local_code = local_code;
    in.num_history = num_history;
    in.flags = flags.data();
    in.vocab = flags.shape(0) - 1;
    in.num_flags = flags.shape(1);
    in.budgets = budgets.data();
    in.num_budgets = budgets.shape(0);
    return in;
}

// Native request states (request_state.hpp) as StateBatch's columns: pos, prompt length,
// history [b, kNumHistory], tails [b, kTailTokens] (-1 padded) and tail lengths (with the GIL:
// each state is cast from its Python object).
static void state_columns(const py::sequence& states, double* pos, double* prompt, float* history, int64_t* tails,
                          int64_t* tail_lens) {
    constexpr py::ssize_t kT = hvd::kTailTokens, kH = hvd::kNumHistory;
    double row[hvd::kColumns];
    const py::ssize_t b = static_cast<py::ssize_t>(py::len(states));
    for (py::ssize_t i = 0; i < b; ++i) {
        states[i].cast<const hvd::RequestState&>().row(row);  // (its packed row: pos, prompt, tail length, ...)
        pos[i] = row[0];
        prompt[i] = row[1];
        tail_lens[i] = static_cast<int64_t>(row[2]);
        for (py::ssize_t k = 0; k < kT; ++k) tails[i * kT + k] = static_cast<int64_t>(row[3 + k]);
        for (py::ssize_t k = 0; k < kH; ++k) history[i * kH + k] = static_cast<float>(row[3 + kT + k]);
    }
}

PYBIND11_MODULE(_native, m) {
    m.doc() = "Native SuffixDecoding drafter core (see sglang_hvd/drafter/native/)";
    py::class_<SuffixDrafter>(m, "Core")
        .def(py::init([](int max_depth, int max_spec_tokens, double factor, double offset, double min_prob,
                         int64_t global_max_tokens, int64_t max_occurrences, int64_t max_scan, int threads) {
                 if (threads < 1) throw std::invalid_argument("threads must be >= 1");
                 Config c;
                 c.max_depth = max_depth;
                 c.max_spec_tokens = max_spec_tokens;
                 c.max_spec_factor = factor;
                 c.max_spec_offset = offset;
                 c.min_token_prob = min_prob;
                 c.global_max_tokens = global_max_tokens;
                 c.max_occurrences = max_occurrences;
                 c.max_scan = max_scan;  // DrafterConfig.scan_limit: already >= max_occurrences
                 return new SuffixDrafter(c, threads);
             }),
             py::arg("max_depth"), py::arg("max_spec_tokens"), py::arg("max_spec_factor"), py::arg("max_spec_offset"),
             py::arg("min_token_prob"), py::arg("global_max_tokens"), py::arg("max_occurrences"),
             py::arg("max_scan"), py::arg("threads") = 1)
        .def("threads", &SuffixDrafter::threads)
        .def("reset", &SuffixDrafter::reset)
        .def("start", [](SuffixDrafter& s, int64_t req, I32 prompt) {
            auto p = prompt.unchecked<1>();
            py::gil_scoped_release nogil;
            s.start(req, p.data(0), p.shape(0));
        })
        .def("append", [](SuffixDrafter& s, int64_t req, I32 tokens) {
            auto t = tokens.unchecked<1>();
            py::gil_scoped_release nogil;
            s.append(req, t.data(0), t.shape(0));
        })
        .def("append_one", [](SuffixDrafter& s, int64_t req, int32_t token) {
            if (token < 0) throw std::invalid_argument("token ids must be non-negative");
            s.append(req, &token, 1);
        })
        .def("append_batch",
             [](SuffixDrafter& s, const std::vector<int64_t>& reqs, const std::vector<std::vector<int32_t>>& tokens) {
                 // Request reqs[i] emitted tokens[i] (Python lists, converted once): every request
                 // and token is checked before anything is appended.
                 if (reqs.size() != tokens.size()) throw std::invalid_argument("one token list per request");
                 for (int64_t r : reqs)
                     if (!s.is_running(r)) throw py::key_error("request is not running (start_request first)");
                 for (const auto& t : tokens)
                     for (int32_t tok : t)
                         if (tok < 0) throw std::invalid_argument("token ids must be non-negative");
                 py::gil_scoped_release nogil;
                 for (size_t i = 0; i < reqs.size(); ++i) s.append(reqs[i], tokens[i].data(), static_cast<int64_t>(tokens[i].size()));
             })
        .def("finish", &SuffixDrafter::finish)
        .def("speculate", [](SuffixDrafter& s, int64_t req) {
            Draft d;
            {
                py::gil_scoped_release nogil;
                d = s.speculate(req);
            }
            return draft_tuple(d);
        })
        .def("speculate_tree", [](SuffixDrafter& s, int64_t req, int max_nodes, int only_tree, int only_p) {
            hvd::TreeDraft d;
            {
                py::gil_scoped_release nogil;
                d = s.speculate_tree(req, max_nodes, only_tree, only_p);
            }
            py::tuple tokens(d.tokens.size()), parents(d.parents.size()), probs(d.probs.size()), counts(d.child_counts.size());
            for (size_t i = 0; i < d.tokens.size(); ++i) {
                tokens[i] = py::int_(d.tokens[i]);
                parents[i] = py::int_(d.parents[i]);
                probs[i] = py::float_(d.probs[i]);
                counts[i] = py::int_(d.child_counts[i]);
            }
            return py::make_tuple(tokens, parents, probs, counts, d.score, d.match_len, d.match_count, d.tree);
        }, py::arg("req"), py::arg("max_nodes"), py::arg("only_tree") = 0, py::arg("only_p") = 0)
        .def("speculate_rows",
             [](SuffixDrafter& s, I64 reqs, int max_nodes) {
                 // Row trees of a batch: row_tokens/row_parents [B, max_nodes] (-1 padded), row_probs
                 // [B, max_nodes] (0 padded), row_lengths [B].
                 if (max_nodes < 1) throw std::invalid_argument("max_nodes must be >= 1");
                 auto r = reqs.unchecked<1>();
                 py::dict out;
                 RowArrays rows(out, r.shape(0), max_nodes);
                 {
                     py::gil_scoped_release nogil;
                     s.for_rows(r.data(0), r.shape(0),
                                [&](int64_t i, int w) { rows.put(i, s.speculate_row(r(i), max_nodes, w)); });
                 }
                 return out;
             })
        .def("speculate_batch",
             [](SuffixDrafter& s, I64 reqs) {
                 // Arrays for a decode batch: tokens/probs/child_counts are [B, max_spec_tokens]
                 // (padded with -1 / 0), the rest [B].
                 auto r = reqs.unchecked<1>();
                 py::dict out;
                 DraftArrays drafts(out, r.shape(0), s.config().max_spec_tokens);
                 {
                     py::gil_scoped_release nogil;
                     s.for_rows(r.data(0), r.shape(0), [&](int64_t i, int w) { drafts.put(i, s.speculated(r(i), w)); });
                 }
                 return out;
             })
        .def("speculate_step",
             [](SuffixDrafter& s, I64 reqs, int max_nodes, int siblings) {
                 // speculate_batch's arrays and speculate_rows' in one dict, each row's tree grown
                 // right after its chain (the chain's occurrence set still in the cache); with
                 // siblings >= 0, to at most min(its chain + siblings, max_nodes) nodes.
                 if (max_nodes < 1) throw std::invalid_argument("max_nodes must be >= 1");
                 auto r = reqs.unchecked<1>();
                 py::dict out;
                 DraftArrays drafts(out, r.shape(0), s.config().max_spec_tokens);
                 RowArrays rows(out, r.shape(0), max_nodes);
                 {
                     py::gil_scoped_release nogil;
                     s.for_rows(r.data(0), r.shape(0), [&](int64_t i, int w) {
                         const hvd::Draft& chain = s.speculated(r(i), w);
                         drafts.put(i, chain);
                         const int64_t cut = siblings < 0 ? max_nodes
                             : std::min<int64_t>(max_nodes, static_cast<int64_t>(chain.tokens.size()) + siblings);
                         if (cut > 0) rows.put(i, s.speculate_row(r(i), static_cast<int>(cut), w));
                         else rows.put(i, hvd::RowTree{});
                     });
                 }
                 return out;
             }, py::arg("reqs"), py::arg("max_nodes"), py::arg("siblings") = -1)
        .def("context", [](SuffixDrafter& s, int64_t req) {
            auto v = s.context(req);
            return py::array_t<int32_t>(v.size(), v.data());
        })
        .def("is_running", &SuffixDrafter::is_running)
        .def("global_tokens", &SuffixDrafter::global_tokens)
        .def("local_tokens", &SuffixDrafter::local_tokens)
        .def("nbytes", &SuffixDrafter::nbytes)
        .def("evicted", &SuffixDrafter::evicted)
        .def("compactions", &SuffixDrafter::compactions)
        .def("reused_prompt_tokens", &SuffixDrafter::reused_prompt_tokens)
        .def("pending_frees", &SuffixDrafter::pending_frees);

    // features.py's FeatureExtractor.features: the non-tree columns of out, in place.
    m.def("gate_features",
          [](py::array out, I32 tokens, F64 probs, I64 child_counts, I32 lengths,
             I32 match_len, I64 match_count, F64 score, I32 tree, int32_t local_code, F64 pos, F64 prompt_len,
             F32 history, I64 tails, I64 tail_lens, U8 flags, F32 budgets) {
              const py::ssize_t b = lengths.shape(0);
              auto same_rows = [b](const py::array& a) { return a.ndim() >= 1 && a.shape(0) == b; };
              if (!same_rows(pos) || !same_rows(prompt_len) || history.ndim() != 2 || !same_rows(history) ||
                  tails.ndim() != 2 || !same_rows(tails) || !same_rows(tail_lens))
                  throw std::invalid_argument("gate_features: arrays of mismatched shapes");
              hvd::FeatureInputs in = draft_features(out, tokens, probs, child_counts, lengths, match_len, match_count,
                                                     score, tree, local_code, flags, budgets, history.shape(1),
                                                     "gate_features");
              in.pos = pos.data();
              in.prompt_len = prompt_len.data();
              in.history = history.data();
              in.tails = tails.data();
              in.tail_lens = tail_lens.data();
              in.tail_tokens = tails.shape(1);
              float* o = static_cast<float*>(out.mutable_data());
              const int64_t cols = out.shape(1);
              py::gil_scoped_release nogil;
              hvd::gate_features(in, o, cols);
          });

    // A decode step's features in one call (FeatureExtractor.step_features): gate_features over
    // the rows' native states, then, given row trees, the tree group of each drafted row's tree
    // cut at min(its length, chain + siblings, nodes) nodes (decision.described; other rows: none).
    m.def("step_features",
          [](py::array out, I32 tokens, F64 probs, I64 child_counts, I32 lengths, I32 match_len, I64 match_count,
             F64 score, I32 tree, int32_t local_code, const py::sequence& states, std::optional<I32> tree_parents,
             std::optional<F64> tree_probs, std::optional<I32> tree_lengths, int64_t siblings, int64_t nodes,
             U8 flags, F32 budgets) {
              const py::ssize_t b = lengths.shape(0);
              const bool trees = tree_parents.has_value();
              if (static_cast<py::ssize_t>(py::len(states)) != b || trees != tree_probs.has_value() ||
                  trees != tree_lengths.has_value() ||
                  (trees && (tree_parents->ndim() != 2 || tree_parents->shape(0) != b || tree_probs->ndim() != 2 ||
                             tree_probs->shape(0) != b || tree_probs->shape(1) != tree_parents->shape(1) ||
                             tree_lengths->ndim() != 1 || tree_lengths->shape(0) != b)))
                  throw std::invalid_argument("step_features: arrays of mismatched shapes");
              constexpr int64_t kT = hvd::kTailTokens, kH = hvd::kNumHistory;
              hvd::FeatureInputs in = draft_features(out, tokens, probs, child_counts, lengths, match_len, match_count,
                                                     score, tree, local_code, flags, budgets, kH, "step_features");
              const int64_t cols = out.shape(1);
              if (trees && cols < 14 + kH + 3 * in.num_flags + 5)
                  throw std::invalid_argument("step_features: out has no room for the tree group");
              std::vector<double> pos(static_cast<size_t>(b)), prompt(static_cast<size_t>(b));
              std::vector<float> history(static_cast<size_t>(b * kH));
              std::vector<int64_t> tails(static_cast<size_t>(b * kT)), tail_lens(static_cast<size_t>(b));
              state_columns(states, pos.data(), prompt.data(), history.data(), tails.data(), tail_lens.data());
              in.pos = pos.data();
              in.prompt_len = prompt.data();
              in.history = history.data();
              in.tails = tails.data();
              in.tail_lens = tail_lens.data();
              in.tail_tokens = kT;
              const int64_t w = trees ? tree_parents->shape(1) : 0;
              const int32_t* par = trees ? tree_parents->data() : nullptr;
              for (int64_t k = 0; k < b * w; ++k)
                  if (par[k] < -1 || par[k] >= w) throw std::invalid_argument("step_features: a parent out of range");
              float* o = static_cast<float*>(out.mutable_data());
              py::gil_scoped_release nogil;
              hvd::gate_features(in, o, cols);
              if (!trees) return;
              std::vector<int32_t> cut(static_cast<size_t>(b));
              const int32_t* lens = in.lengths;
              const int32_t* have = tree_lengths->data();
              for (py::ssize_t i = 0; i < b; ++i)
                  cut[static_cast<size_t>(i)] = lens[i] > 0 && siblings > 0
                      ? static_cast<int32_t>(std::min<int64_t>({have[i], lens[i] + siblings, nodes})) : 0;
              hvd::tree_features(b, w, par, tree_probs->data(), lens, cut.data(), o, cols, cols - 5);
          });

    // features.tree_features: the tree group into out[:, col : col + 5], in place.
    m.def("tree_features", [](py::array out, int64_t col, I32 parents, F64 probs, I32 chain_lens, I32 num_nodes) {
        if (!out.dtype().is(py::dtype::of<float>()) || !(out.flags() & py::array::c_style) || !out.writeable() ||
            out.ndim() != 2)
            throw std::invalid_argument("tree_features: out must be a writeable C-contiguous 2-d float32 array");
        const py::ssize_t b = out.shape(0);
        if (parents.ndim() != 2 || probs.ndim() != 2 || parents.shape(0) != b || probs.shape(0) != b ||
            probs.shape(1) != parents.shape(1) || chain_lens.ndim() != 1 || chain_lens.shape(0) != b ||
            num_nodes.ndim() != 1 || num_nodes.shape(0) != b || col < 0 || col + 5 > out.shape(1))
            throw std::invalid_argument("tree_features: arrays of mismatched shapes");
        const int64_t w = parents.shape(1);
        const int32_t* par = parents.data();
        for (py::ssize_t k = 0; k < b * w; ++k)
            if (par[k] < -1 || par[k] >= w) throw std::invalid_argument("tree_features: a parent out of range");
        float* o = static_cast<float*>(out.mutable_data());
        const int64_t cols = out.shape(1);
        py::gil_scoped_release nogil;
        hvd::tree_features(b, w, par, probs.data(), chain_lens.data(), num_nodes.data(), o, cols, col);
    });

    // cost_rule.choose_mode: (mode index, rows [B] bool, expected tokens, reserve [B] int32 or None).
    using I8 = py::array_t<int8_t, py::array::c_style | py::array::forcecast>;
    m.def("choose_mode",
          [](F64 predicted, I32 lens, std::optional<F64> survival, int64_t cap, F64 inverse,
             std::optional<I8> control, int64_t eagle_reserve, I64 nodes, I64 kinds, F64 floor, F64 step_ms,
             I64 tree_modes, F64 tree_beside) {
              const py::ssize_t b = lens.shape(0), modes = nodes.shape(0);
              if (lens.ndim() != 1 || predicted.ndim() != 1 || predicted.shape(0) != b || kinds.shape(0) != modes ||
                  floor.shape(0) != modes || step_ms.shape(0) != modes || modes < 1 || inverse.ndim() != 2 ||
                  inverse.shape(1) < 2 || tree_beside.ndim() != 2 || tree_beside.shape(0) != tree_modes.shape(0) ||
                  (survival && (survival->ndim() != 2 || survival->shape(0) != b)) ||
                  (control && (control->ndim() != 1 || control->shape(0) != b)))
                  throw std::invalid_argument("choose_mode: arrays of mismatched shapes");
              hvd::ModeInputs in;
              in.b = b;
              in.predicted = predicted.data();
              in.lens = lens.data();
              if (survival) {
                  in.survival = survival->data();
                  in.survival_width = survival->shape(1);
              }
              in.cap = cap;
              in.inverse = inverse.data();
              in.max_nodes = inverse.shape(0) - 1;
              in.fractions = inverse.shape(1) - 1;
              in.control = control ? control->data() : nullptr;
              in.eagle_reserve = eagle_reserve;
              in.modes = modes;
              in.nodes = nodes.data();
              in.kinds = kinds.data();
              in.floor = floor.data();
              in.step_ms = step_ms.data();
              in.tree_modes = tree_modes.data();
              in.tree = tree_modes.shape(0);
              in.tree_beside = tree_beside.data();
              in.beside = tree_beside.shape(1);
              for (py::ssize_t t = 0; t < in.tree; ++t)
                  if (in.tree_modes[t] < 0 || in.tree_modes[t] >= modes || in.nodes[in.tree_modes[t]] > in.beside)
                      throw std::invalid_argument("choose_mode: a tree mode out of range");
              for (py::ssize_t k = 0; k < modes; ++k)
                  if (in.nodes[k] < 0 || in.nodes[k] > in.max_nodes)
                      throw std::invalid_argument("choose_mode: a mode's nodes out of range");
              py::array_t<bool> rows(b);
              py::array_t<int32_t> reserve(b);
              hvd::ModePick pick;
              {
                  py::gil_scoped_release nogil;
                  pick = hvd::choose_mode(in, reinterpret_cast<uint8_t*>(rows.mutable_data()), reserve.mutable_data());
              }
              py::object per_row = pick.per_row_reserve ? py::object(reserve) : py::object(py::none());
              return py::make_tuple(pick.mode, rows, pick.expected, per_row);
          });

    // decision._row_plans_numpy: (cache [B], eagle [B], tokens [B, n], parents [B, n]) int32.
    using Bool = py::array_t<bool, py::array::c_style | py::array::forcecast>;
    m.def("row_plans",
          [](Bool use, I32 lens, int64_t reserve, std::optional<I32> reserve_rows, int64_t n, bool branches,
             bool eagle3, I32 draft_tokens, std::optional<I32> tree_tokens, std::optional<I32> tree_parents,
             std::optional<I32> tree_lengths, int64_t siblings, std::optional<I32> siblings_rows,
             std::optional<I8> control) {
              const py::ssize_t b = lens.shape(0);
              const bool trees = tree_tokens.has_value();
              if (lens.ndim() != 1 || use.ndim() != 1 || use.shape(0) != b || draft_tokens.ndim() != 2 ||
                  draft_tokens.shape(0) != b || n < 0 || (reserve_rows && reserve_rows->shape(0) != b) ||
                  (siblings_rows && siblings_rows->shape(0) != b) || (control && control->shape(0) != b) ||
                  trees != tree_parents.has_value() || trees != tree_lengths.has_value() ||
                  (trees && (tree_tokens->ndim() != 2 || tree_tokens->shape(0) != b || tree_tokens->shape(1) < n ||
                             tree_parents->ndim() != 2 || tree_parents->shape(0) != b ||
                             tree_parents->shape(1) != tree_tokens->shape(1) || tree_lengths->shape(0) != b)))
                  throw std::invalid_argument("row_plans: arrays of mismatched shapes");
              hvd::RowPlanInputs in;
              in.b = b;
              in.n = n;
              in.branches = branches;
              in.eagle3 = eagle3;
              in.use = reinterpret_cast<const uint8_t*>(use.data());
              in.lens = lens.data();
              in.reserve = reserve;
              in.reserve_rows = reserve_rows ? reserve_rows->data() : nullptr;
              in.draft_tokens = draft_tokens.data();
              in.width = draft_tokens.shape(1);
              if (trees) {
                  in.tree_tokens = tree_tokens->data();
                  in.tree_parents = tree_parents->data();
                  in.tree_lengths = tree_lengths->data();
                  in.tree_width = tree_tokens->shape(1);
              }
              in.siblings = siblings;
              in.siblings_rows = siblings_rows ? siblings_rows->data() : nullptr;
              in.control = control ? control->data() : nullptr;
              py::array_t<int32_t> cache(b), eagle(b), tokens({b, static_cast<py::ssize_t>(n)}),
                  parents({b, static_cast<py::ssize_t>(n)});
              {
                  py::gil_scoped_release nogil;
                  hvd::row_plans(in, cache.mutable_data(), eagle.mutable_data(), tokens.mutable_data(),
                                 parents.mutable_data());
              }
              return py::make_tuple(cache, eagle, tokens, parents);
          });

    using hvd::RequestState;
    m.attr("STATE_COLUMNS") = hvd::kColumns;  // request_state._COLUMNS (a test holds them equal)
    py::class_<RequestState>(m, "RequestState")
        .def(py::init([](I32 prompt) {
                 auto p = prompt.unchecked<1>();
                 return new RequestState(p.shape(0) ? p.data(0) : nullptr, p.shape(0));
             }),
             py::arg("prompt_ids"))
        .def("observe", [](RequestState& s, const std::vector<int32_t>& tokens) {
            s.observe(tokens.data(), static_cast<int64_t>(tokens.size()));
        })
        .def("record", [](RequestState& s, const std::vector<int32_t>& tokens) {
            s.record(tokens.data(), static_cast<int64_t>(tokens.size()));
        })
        .def("row", [](const RequestState& s) {
            std::vector<double> out(hvd::kColumns);
            s.row(out.data());
            return out;
        })
        .def("snapshot", [](const RequestState& s) {  // RequestState.snapshot: request_state.StateSnapshot
            std::vector<double> r(hvd::kColumns);
            s.row(r.data());
            const auto tail = s.tail();
            py::tuple tokens(tail.size()), history(hvd::kNumHistory);
            for (size_t i = 0; i < tail.size(); ++i) tokens[i] = py::int_(tail[i]);
            for (int i = 0; i < hvd::kNumHistory; ++i) history[i] = py::float_(r[3 + hvd::kTailTokens + i]);
            py::object snapshot = py::module_::import("sglang_hvd.request_state").attr("StateSnapshot");
            return snapshot(s.pos(), s.num_prompt_tokens(), tokens, history);
        })
        .def_property_readonly("pos", &RequestState::pos)
        .def_property_readonly("num_prompt_tokens", &RequestState::num_prompt_tokens)
        .def_property_readonly("tail", &RequestState::tail)
        // A batch's states in StateBatch's packed layout: [B, columns] float64, one call.
        // The states as StateBatch's arrays: pos, num_prompt_tokens [B] float64, history [B, H]
        // float32, tails [B, T] int64 (-1 padded), tail_lens [B] int64 (request_state.StateBatch).
        .def_static("pack_rows", [](const py::sequence& states) {
            const py::ssize_t b = static_cast<py::ssize_t>(py::len(states));
            py::array_t<double> pos(b), prompt(b);
            py::array_t<float> history({b, static_cast<py::ssize_t>(hvd::kNumHistory)});
            py::array_t<int64_t> tails({b, static_cast<py::ssize_t>(hvd::kTailTokens)}), tail_lens(b);
            state_columns(states, pos.mutable_data(), prompt.mutable_data(), history.mutable_data(),
                          tails.mutable_data(), tail_lens.mutable_data());
            return py::make_tuple(pos, prompt, history, tails, tail_lens);
        })
        // Each state's emitted tokens (tokens[i] into states[i]), one call for a step's rows.
        .def_static("observe_rows", [](const py::sequence& states, const std::vector<std::vector<int32_t>>& tokens) {
            const size_t b = static_cast<size_t>(py::len(states));
            if (tokens.size() != b) throw std::invalid_argument("one token list per state");
            for (size_t i = 0; i < b; ++i)
                states[static_cast<py::ssize_t>(i)].cast<RequestState&>().observe(
                    tokens[i].data(), static_cast<int64_t>(tokens[i].size()));
        })
        // Each row's draft (its first lens[i] tokens of tokens[i]; none when 0) into its state.
        .def_static("record_rows", [](const py::sequence& states, I32 tokens, I32 lens) {
            auto t = tokens.unchecked<2>();
            auto n = lens.unchecked<1>();
            const py::ssize_t b = static_cast<py::ssize_t>(py::len(states));
            if (n.shape(0) != b || t.shape(0) != b) throw std::invalid_argument("one draft per state");
            for (py::ssize_t i = 0; i < b; ++i) {
                if (n(i) > t.shape(1)) throw std::invalid_argument("a draft longer than its row");
                if (n(i) > 0) states[i].cast<RequestState&>().record(t.data(i, 0), n(i));
            }
        });
}
