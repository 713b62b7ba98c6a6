// A request's decision state, native: the same values as sglang_hvd/request_state.py's
// RequestState (the reference, with the leak-free rule and a worked example), packed for a
// batch in one call (StateBatch's layout). It shares the drafter's extension so that one
// build serves both; the decision reads it through request_state.py alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace hvd {

constexpr int kHistoryK = 4;     // request_state.HISTORY_K
constexpr int kMissWindow = 16;  // request_state.MISS_WINDOW
constexpr int kTailTokens = 8;   // request_state.TAIL_TOKENS
constexpr int kNumHistory = 2 * kHistoryK + 4;
constexpr int kColumns = 3 + kTailTokens + kNumHistory;  // request_state._COLUMNS

class RequestState {
public:
    RequestState(const int32_t* prompt, int64_t n) : num_prompt_tokens_(n) {
        for (int64_t i = std::max<int64_t>(0, n - kTailTokens); i < n; ++i) push_tail(prompt[i]);
    }

    int64_t pos() const { return pos_; }
    int64_t num_prompt_tokens() const { return num_prompt_tokens_; }
    std::vector<int32_t> tail() const { return std::vector<int32_t>(tail_.begin(), tail_.end()); }

    // Every token the request emits, in order (RequestState.observe).
    void observe(const int32_t* tokens, int64_t n) {
        if (n <= 0) return;
        const int64_t start = pos_;
        pos_ += n;
        for (int64_t i = std::max<int64_t>(0, n - kTailTokens); i < n; ++i) push_tail(tokens[i]);
        if (open_.empty()) return;
        std::vector<std::shared_ptr<Entry>> still_open;
        for (auto& e : open_) {
            // an open entry has matched every token so far: e->confirmed == start - e->pos
            const int64_t offset = start - e->pos;
            const int64_t size = static_cast<int64_t>(e->tokens.size());
            const int64_t m = std::min(n, size - offset);
            int64_t k = 0;
            while (k < m && e->tokens[static_cast<size_t>(offset + k)] == tokens[k]) ++k;
            e->confirmed = offset + k;
            if (k < m) {
                e->broke = true;
                if (!e->confirmed && e->seq >= recorded_ - kMissWindow) ++misses_;  // a miss still in the window
            }
            if (e->broke || e->confirmed == size) {
                resolved_sum_ += e->confirmed;
                resolved_count_ += 1;
            } else {
                still_open.push_back(e);
            }
        }
        open_ = std::move(still_open);
    }

    // A cache draft judged at the current position, before its verify (RequestState.record).
    void record(const int32_t* tokens, int64_t n) {
        if (n <= 0) return;
        auto e = std::make_shared<Entry>();
        e->pos = pos_;
        e->tokens.assign(tokens, tokens + n);
        e->seq = recorded_++;
        if (static_cast<int>(recent_.size()) == kMissWindow) {  // the oldest leaves the window
            if (recent_.front()->miss()) --misses_;
            recent_.pop_front();
        }
        recent_.push_back(e);
        open_.push_back(std::move(e));
    }

    // This state as one row of StateBatch's packed layout (kColumns values; RequestState.row).
    void row(double* out) const {
        out[0] = static_cast<double>(pos_);
        out[1] = static_cast<double>(num_prompt_tokens_);
        out[2] = static_cast<double>(tail_.size());
        for (int i = 0; i < kTailTokens; ++i)
            out[3 + i] = i < static_cast<int>(tail_.size()) ? static_cast<double>(tail_[static_cast<size_t>(i)]) : -1.0;
        double* h = out + 3 + kTailTokens;
        std::fill(h, h + kNumHistory, 0.0);
        if (recent_.empty()) return;
        const int shown = std::min<int>(kHistoryK, static_cast<int>(recent_.size()));
        for (int i = 0; i < shown; ++i) {
            const Entry& e = *recent_[recent_.size() - 1 - static_cast<size_t>(i)];
            h[i] = static_cast<double>(e.confirmed);
            h[kHistoryK + i] = e.broke ? 1.0 : 0.0;
        }
        h[2 * kHistoryK] = std::log1p(static_cast<double>(pos_ - recent_.back()->pos));
        h[2 * kHistoryK + 1] =
            resolved_count_ ? static_cast<double>(resolved_sum_) / static_cast<double>(resolved_count_) : 0.0;
        h[2 * kHistoryK + 2] = std::log1p(static_cast<double>(resolved_count_));
        h[2 * kHistoryK + 3] = static_cast<double>(misses_) / static_cast<double>(recent_.size());
    }

private:
    struct Entry {
        int64_t pos = 0;
        std::vector<int32_t> tokens;
        int64_t confirmed = 0;
        bool broke = false;
        int64_t seq = 0;
        bool miss() const { return broke && confirmed == 0; }  // broke on its first token
    };

    void push_tail(int32_t t) {
        if (static_cast<int>(tail_.size()) == kTailTokens) tail_.pop_front();
        tail_.push_back(t);
    }

    int64_t num_prompt_tokens_;
    int64_t pos_ = 0;  // output tokens observed
    std::deque<int32_t> tail_;
    std::deque<std::shared_ptr<Entry>> recent_;  // the last kMissWindow drafts
    std::vector<std::shared_ptr<Entry>> open_;   // drafts still unresolved
    int64_t resolved_sum_ = 0, resolved_count_ = 0;
    int64_t recorded_ = 0;  // drafts recorded so far (an entry's seq)
    int64_t misses_ = 0;    // entries of recent_ that broke on their first token
};

}  // namespace hvd
