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
#include <string_view>

namespace kdedup::pipeline {

class FatalError {
 public:
  /// `log_prefix` starts the message, logged and returned ("repartition: "
  /// for the stage), unless the message already starts with the stage's
  /// name ("repartition consumer fatal error: ...").
  explicit FatalError(std::string log_prefix = {})
      : log_prefix_(std::move(log_prefix)), stage_(log_prefix_.substr(0, log_prefix_.find(':'))) {}

  void set(std::string message) {
    if (!std::string_view(message).starts_with(stage_)) message.insert(0, log_prefix_);
    std::lock_guard lock(mu_);
    if (message_) {
      spdlog::debug("{}", message);
      return;
    }
    spdlog::error("{}", message);
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
  const std::string stage_;  // log_prefix_ up to its ':' ("repartition")
  mutable std::mutex mu_;
  std::optional<std::string> message_;
  std::atomic<bool> raised_{false};
};

}  // namespace kdedup::pipeline
