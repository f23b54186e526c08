#pragma once
// Health: the state behind /healthz (liveness) and /readyz (readiness).
//
// Liveness: the main loop calls beat() every iteration; if no beat arrived
// within `stale_after` the process is considered hung (503), so an
// orchestrator restarts it. Construction counts as the first beat, which
// gives startup one full `stale_after` of grace.
// Readiness: the pipeline calls set_ready() once it has joined the group and
// restored every assigned partition, and set_not_ready(reason) whenever that
// stops being true (rebalance, rebuild in progress).
//
// Owned by Metrics. Every method is thread-safe: beat() is a relaxed atomic
// store (cheap enough for every loop iteration); readiness changes take a
// mutex (they are rare).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace kdedup::metrics {

/// An HTTP answer: status code and a short plain-text body.
struct Probe {
  int status = 200;
  std::string body;
};

class Health {
 public:
  explicit Health(std::chrono::milliseconds stale_after);

  void beat() noexcept;
  void set_ready();
  /// `reason` is shown in the /readyz body, e.g. "restoring 3 of 12 partitions".
  void set_not_ready(std::string reason);

  [[nodiscard]] bool ready() const;
  [[nodiscard]] double heartbeat_age_seconds() const noexcept;
  [[nodiscard]] std::chrono::milliseconds stale_after() const noexcept { return stale_after_; }

  [[nodiscard]] Probe liveness() const;
  [[nodiscard]] Probe readiness() const;

 private:
  static std::int64_t now_ns() noexcept;

  const std::chrono::milliseconds stale_after_;
  std::atomic<std::int64_t> last_beat_ns_;
  mutable std::mutex mu_;
  bool ready_ = false;
  std::string not_ready_reason_ = "starting";
};

}  // namespace kdedup::metrics
