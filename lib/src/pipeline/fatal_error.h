#pragma once
// FatalError: the first problem that stops `kdedup run`. Whoever meets one
// (a worker, the delivery thread, librdkafka's event callback, the consumer
// thread) sets it; the consumer loop sees raised() at its next turn, shuts
// down and returns the message. Later problems are only logged.
//
// Owned by the Pipeline; every method is thread-safe.

#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

namespace kdedup::pipeline {

class FatalError {
 public:
  void set(std::string message) {
    std::lock_guard lock(mu_);
    if (!message_) {
      spdlog::error("{}", message);
      message_ = std::move(message);
      raised_.store(true, std::memory_order_release);
    }
  }
  [[nodiscard]] bool raised() const noexcept { return raised_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string message() const {
    std::lock_guard lock(mu_);
    return message_.value_or("");
  }

 private:
  mutable std::mutex mu_;
  std::optional<std::string> message_;
  std::atomic<bool> raised_{false};
};

}  // namespace kdedup::pipeline
