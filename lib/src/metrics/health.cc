#include "kdedup/metrics/health.h"

#include <cstdio>

namespace kdedup::metrics {

Health::Health(std::chrono::milliseconds stale_after)
    : stale_after_(stale_after), last_beat_ns_(now_ns()) {}

std::int64_t Health::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Health::beat() noexcept { last_beat_ns_.store(now_ns(), std::memory_order_relaxed); }

void Health::set_ready() {
  std::lock_guard lock(mu_);
  ready_ = true;
  not_ready_reason_.clear();
}

void Health::set_not_ready(std::string reason) {
  std::lock_guard lock(mu_);
  ready_ = false;
  not_ready_reason_ = reason.empty() ? "not ready" : std::move(reason);
}

bool Health::ready() const {
  std::lock_guard lock(mu_);
  return ready_;
}

double Health::heartbeat_age_seconds() const noexcept {
  const std::int64_t age = now_ns() - last_beat_ns_.load(std::memory_order_relaxed);
  return static_cast<double>(age > 0 ? age : 0) / 1e9;
}

Probe Health::liveness() const {
  const double age = heartbeat_age_seconds();
  const double limit = static_cast<double>(stale_after_.count()) / 1e3;
  if (age <= limit) return Probe{200, "ok\n"};
  char body[160];
  std::snprintf(body, sizeof body, "main loop stalled: last heartbeat %.3f s ago (limit %.3f s)\n",
                age, limit);
  return Probe{503, body};
}

Probe Health::readiness() const {
  std::lock_guard lock(mu_);
  if (ready_) return Probe{200, "ready\n"};
  return Probe{503, "not ready: " + not_ready_reason_ + "\n"};
}

}  // namespace kdedup::metrics
