// The threads a batch's drafts run on: the calling thread and ``threads - 1`` workers, started
// with the pool and asleep between batches (no spinning). ``run(n, fn)`` calls fn(i, w) for
// every row i in [0, n), w the index of the thread running it (0: the caller): rows are handed
// out one at a time, so a row with a long search does not hold up a whole share. A row's result
// depends on the row alone (each thread its own scratch), never on which thread ran it or when.
// The first exception a row throws stops the handing out and is rethrown by run. A process
// forked from the pool's owner has none of its threads: there every batch runs inline.
#pragma once

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace hvd {

class Pool {
public:
    explicit Pool(int threads) {
        if (threads < 1) throw std::invalid_argument("threads must be >= 1");
        for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { serve(w); });
    }
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    ~Pool() {
        if (getpid() != owner_) {  // a forked child: the threads are the parent's
            for (std::thread& t : workers_) t.detach();
            static_cast<void>(sync_.release());
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        wake_.notify_all();
        for (std::thread& t : workers_) t.join();
    }

    int size() const { return static_cast<int>(workers_.size()) + 1; }

    // fn(i, w) for every i in [0, n); rows run inline (w = 0) when the pool has no workers (or
    // this is a forked child) or there is one row.
    template <class Fn>
    void run(int64_t n, Fn&& fn) {
        if (workers_.empty() || n < 2 || getpid() != owner_) {
            for (int64_t i = 0; i < n; ++i) fn(i, 0);
            return;
        }
        std::function<void(int64_t, int)> job = [&fn](int64_t i, int w) { fn(i, w); };
        {
            std::lock_guard<std::mutex> lock(mu_);
            job_ = &job;
            rows_ = n;
            next_.store(0, std::memory_order_relaxed);
            error_ = nullptr;
            busy_ = static_cast<int>(workers_.size());
            ++generation_;
        }
        wake_.notify_all();
        take(0);
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [this] { return busy_ == 0; });
        job_ = nullptr;
        if (error_) std::rethrow_exception(error_);
    }

private:
    // Rows until none is left (or one failed).
    void take(int w) {
        for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < rows_;) {
            try {
                (*job_)(i, w);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu_);
                if (!error_) error_ = std::current_exception();
                next_.store(rows_, std::memory_order_relaxed);
            }
        }
    }

    void serve(int w) {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            lock.unlock();
            take(w);
            lock.lock();
            if (--busy_ == 0) done_.notify_one();
        }
    }

    const pid_t owner_ = getpid();
    // The lock and conditions live on the heap: a forked child leaks them (destroying a
    // condition the parent's threads wait on would wait for them, forever).
    struct Sync {
        std::mutex mu;
        std::condition_variable wake, done;
    };
    std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
    std::mutex& mu_ = sync_->mu;
    std::condition_variable &wake_ = sync_->wake, &done_ = sync_->done;
    std::vector<std::thread> workers_;
    const std::function<void(int64_t, int)>* job_ = nullptr;
    int64_t rows_ = 0;
    std::atomic<int64_t> next_{0};
    std::exception_ptr error_;
    int busy_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
};

}  // namespace hvd
