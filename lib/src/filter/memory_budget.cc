// The instance-wide memory budget; the contract is in memory_budget.h.

#include "kdedup/filter/memory_budget.h"

#include <algorithm>
#include <cmath>

namespace kdedup::filter {

double effective_fpp(double fpp, double scale) noexcept {
  if (!(scale > 1.0)) return fpp;
  return std::max(fpp, std::min(fpp * scale, kMaxEffectiveFpp));
}

MemoryBudget::MemoryBudget(Options options) : options_(std::move(options)) {
  // Levels past the one that reaches kMaxEffectiveFpp change nothing.
  if (options_.max_bytes != 0 && options_.fpp > 0 && options_.fpp < kMaxEffectiveFpp) {
    max_level_ = static_cast<std::uint32_t>(std::ceil(std::log2(kMaxEffectiveFpp / options_.fpp)));
  }
}

double MemoryBudget::fpp_scale() const noexcept {
  return std::ldexp(1.0, static_cast<int>(level()));
}

double MemoryBudget::effective_fpp() const noexcept {
  return filter::effective_fpp(options_.fpp, fpp_scale());
}

bool MemoryBudget::try_reserve(std::uint64_t bytes, std::uint32_t seen_level) noexcept {
  if (options_.max_bytes == 0) {
    used_.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  while (used <= options_.max_bytes && bytes <= options_.max_bytes - used) {
    if (used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed)) return true;
  }
  if (seen_level < max_level_) change_level(seen_level, seen_level + 1);
  return false;
}

void MemoryBudget::charge(std::uint64_t bytes) noexcept {
  used_.fetch_add(bytes, std::memory_order_relaxed);
}

void MemoryBudget::release(std::uint64_t bytes) noexcept {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryBudget::release(std::uint64_t bytes, std::uint32_t seen_level) noexcept {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  if (seen_level != MemoryCharge::kNoLevel) settle(seen_level);
}

void MemoryBudget::settle(std::uint32_t seen_level) noexcept {
  if (seen_level == 0 || level() != seen_level) return;
  if (static_cast<double>(used()) < kLowerBelow * static_cast<double>(options_.max_bytes)) {
    change_level(seen_level, seen_level - 1);
  }
}

void MemoryBudget::change_level(std::uint32_t from, std::uint32_t to) noexcept {
  std::uint32_t expected = from;
  // Only the caller that saw `from` last moves it: a round of failures (or
  // releases) by many filters at one level is one step.
  if (!level_.compare_exchange_strong(expected, to, std::memory_order_relaxed)) return;
  if (options_.on_change) {
    Change c;
    c.level = to;
    c.previous = from;
    c.scale = std::ldexp(1.0, static_cast<int>(to));
    c.used = used();
    c.max_bytes = options_.max_bytes;
    options_.on_change(c);
  }
}

void MemoryCharge::reset(std::uint32_t seen_level) noexcept {
  if (budget_ && bytes_ != 0) {
    if (seen_level == kNoLevel) {
      budget_->release(bytes_);
    } else {
      budget_->release(bytes_, seen_level);
    }
  }
  bytes_ = 0;
}

void MemoryCharge::shrink_to(std::uint64_t bytes, std::uint32_t seen_level) noexcept {
  if (!budget_ || bytes >= bytes_) return;
  if (seen_level == kNoLevel) {
    budget_->release(bytes_ - bytes);
  } else {
    budget_->release(bytes_ - bytes, seen_level);
  }
  bytes_ = bytes;
}

void MemoryCharge::resize(std::uint64_t bytes) noexcept {
  if (!budget_) return;
  if (bytes > bytes_) {
    budget_->charge(bytes - bytes_);
  } else if (bytes < bytes_) {
    budget_->release(bytes_ - bytes);
  }
  bytes_ = bytes;
}

}  // namespace kdedup::filter
