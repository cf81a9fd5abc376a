#include <torch_headers.h> // first: the precompiled torch headers

#include "engine/completions.h"

#include <optional>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "thread_name.h"

namespace fairring {

Completions::~Completions() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) {
    worker.join();
  }
}

c10::intrusive_ptr<c10::ivalue::Future> Completions::relay(
    const c10::intrusive_ptr<c10::ivalue::Future>& inner) {
  auto outer = c10::make_intrusive<c10::ivalue::Future>(
      inner->elementType(), inner->devices());
  relayInto(inner, outer);
  return outer;
}

void Completions::relayInto(
    const c10::intrusive_ptr<c10::ivalue::Future>& inner,
    c10::intrusive_ptr<c10::ivalue::Future> outer) {
  inner->addCallback([self = shared_from_this(),
                      outer = std::move(outer)](c10::ivalue::Future& done) {
    auto completed =
        c10::intrusive_ptr<c10::ivalue::Future>::unsafe_reclaim_from_nonowning(
            &done);
    self->post([device = self->device_, outer, completed] {
      std::optional<c10::StreamGuard> onPoolStream;
      if (device.is_cuda()) {
        onPoolStream.emplace(
            c10::impl::VirtualGuardImpl(device.type())
                .getStreamFromGlobalPool(device));
      }
      // Done already; with CUDA, the current stream now waits for its events,
      // and markCompleted records the outer future's after them.
      completed->wait();
      if (completed->hasError()) {
        outer->setError(completed->exception_ptr());
      } else {
        outer->markCompleted(completed->value());
      }
    });
  });
}

void Completions::relayWaitInto(
    c10::intrusive_ptr<c10d::Work> work,
    c10::intrusive_ptr<c10::ivalue::Future> outer) {
  post([work = std::move(work), outer = std::move(outer)] {
    try {
      work->wait(kNoTimeout);
      std::vector<at::Tensor> result;
      try {
        result = work->result();
      } catch (const c10::Error&) {
        // Some Works keep no result: the caller's tensors hold it.
      }
      outer->markCompleted(c10::IValue(std::move(result)));
    } catch (...) {
      outer->setError(std::current_exception());
    }
  });
}

size_t Completions::workers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

void Completions::post(std::function<void()> task) {
  std::vector<std::thread> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (std::erase(left_, it->get_id()) > 0) {
        finished.push_back(std::move(*it));
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    if (idle_ == 0 && running_ < kMaxWorkers) {
      const bool first = running_ == 0;
      ++running_;
      workers_.emplace_back([this, first] {
        nameThisThread("fr-completion");
        work(first);
      });
    }
  }
  wake_.notify_one();
  for (auto& worker : finished) {
    worker.join(); // it has left its loop: returns at once
  }
}

void Completions::work(bool first) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (tasks_.empty()) {
      if (stopping_) {
        break;
      }
      ++idle_;
      const bool woken = wake_.wait_for(
          lock, kIdleExit, [this] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (!woken && !first) {
        break;
      }
      continue;
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
  --running_;
  left_.push_back(std::this_thread::get_id());
}

} // namespace fairring
