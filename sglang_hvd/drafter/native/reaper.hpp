// Frees what the drafter no longer needs on a thread of its own, off the caller's path.
//
// A finished request's own index (kept a while for the next turn's prompt) holds thousands
// of small allocations; freeing the oldest one took most of a request's finish, on the
// decode step's critical path. ``drop`` hands it here instead: one background thread,
// started at the first drop, frees what it is given, in order; the destructor frees what
// is left and joins it. Nothing dropped is ever read again, so drafts do not depend on
// when it is freed. A process forked from the owner has no such thread: it frees at once.
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace hvd {

template <class T>
class Reaper {
public:
    Reaper() = default;
    Reaper(const Reaper&) = delete;
    Reaper& operator=(const Reaper&) = delete;

    ~Reaper() {
        if (getpid() != owner_) {  // a forked child: the thread is the parent's
            if (thread_.joinable()) thread_.detach();
            queue_.clear();
            static_cast<void>(sync_.release());
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_one();
        if (thread_.joinable()) thread_.join();
        queue_.clear();  // what the thread had not reached (none once it has drained)
    }

    void drop(std::unique_ptr<T> item) {
        if (!item) return;
        if (getpid() != owner_) return;  // a forked child: freed here, now (item goes out of scope)
        {
            std::lock_guard<std::mutex> lock(mu_);
            queue_.push_back(std::move(item));
            if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
        }
        cv_.notify_one();
    }

    // Items waiting to be freed (a test's view: 0 once the thread has caught up).
    size_t pending() {
        std::lock_guard<std::mutex> lock(mu_);
        return queue_.size() + busy_;
    }

private:
    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopped, nothing left
            std::unique_ptr<T> item = std::move(queue_.front());
            queue_.pop_front();
            busy_ = 1;
            lock.unlock();
            item.reset();  // the free, outside the lock
            lock.lock();
            busy_ = 0;
        }
    }

    const pid_t owner_ = getpid();
    // On the heap: a forked child leaks them (as pool.hpp's: the parent's thread waits on cv_).
    struct Sync {
        std::mutex mu;
        std::condition_variable cv;
    };
    std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
    std::mutex& mu_ = sync_->mu;
    std::condition_variable& cv_ = sync_->cv;
    std::deque<std::unique_ptr<T>> queue_;
    size_t busy_ = 0;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace hvd
