#pragma once
// FatalError: the first problem that stops `kdedup run`. Whoever meets one
// (a worker, the delivery thread, librdkafka's event callback, the consumer
// thread) sets it; the consumer loop sees raised() at its next turn, shuts
// down and returns the message. Later problems are only logged (at debug).
//
// Owned by the Pipeline (and the repartition stage); every method is
// thread-safe.

#include <spdlog/spdlog.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

namespace kdedup::pipeline {

class FatalError {
 public:
  /// `log_prefix` starts the log lines ("repartition: " for the stage).
  explicit FatalError(std::string log_prefix = {}) : log_prefix_(std::move(log_prefix)) {}

  void set(std::string message) {
    std::lock_guard lock(mu_);
    if (message_) {
      spdlog::debug("{}{}", log_prefix_, message);
      return;
    }
    spdlog::error("{}{}", log_prefix_, message);
    message_ = std::move(message);
    raised_.store(true, std::memory_order_release);
  }
  [[nodiscard]] bool raised() const noexcept { return raised_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string message() const {
    std::lock_guard lock(mu_);
    return message_.value_or("");
  }

 private:
  const std::string log_prefix_;
  mutable std::mutex mu_;
  std::optional<std::string> message_;
  std::atomic<bool> raised_{false};
};

}  // namespace kdedup::pipeline
