// The instance-wide memory budget; the contract is in memory_budget.h.

#include "kdedup/filter/memory_budget.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace kdedup::filter {

double effective_fpp(double fpp, double scale) noexcept {
  if (!(scale > 1.0)) return fpp;
  return std::max(fpp, std::min(fpp * scale, kMaxEffectiveFpp));
}

bool BudgetLevel::follow(MemoryBudget& budget, std::uint64_t now, std::uint32_t ticks_per_window) {
  const double settle = MemoryBudget::kSettleShare * ticks_per_window;
  const bool held = static_cast<double>(now - since_) >= std::max(1.0, settle);
  budget.settle(held ? level_ : MemoryBudget::kHold, refusals_seen_);  // the load may have fallen
  const std::uint32_t level = budget.level();
  if (level == level_) return false;
  reset(level, now);
  return true;
}

double BudgetLevel::raise(double fpp) const noexcept {
  return effective_fpp(fpp, std::ldexp(1.0, static_cast<int>(level_)));
}

MemoryBudget::MemoryBudget(Options options) : options_(std::move(options)) {
  // Levels past the one that reaches kMaxEffectiveFpp change nothing.
  if (options_.max_bytes != 0 && options_.fpp > 0 && options_.fpp < kMaxEffectiveFpp) {
    max_level_ = std::min<std::uint32_t>(
        kMaxLevels,
        static_cast<std::uint32_t>(std::ceil(std::log2(kMaxEffectiveFpp / options_.fpp))));
  }
}

double MemoryBudget::fpp_scale() const noexcept {
  return std::ldexp(1.0, static_cast<int>(level()));
}

double MemoryBudget::effective_fpp() const noexcept {
  return filter::effective_fpp(options_.fpp, fpp_scale());
}

bool MemoryBudget::try_reserve(std::uint64_t bytes) noexcept {
  return reserve_up_to(bytes, bytes) == bytes;
}

std::uint64_t MemoryBudget::reserve_up_to(std::uint64_t least, std::uint64_t want) noexcept {
  if (options_.max_bytes == 0) {
    used_.fetch_add(want, std::memory_order_relaxed);
    return want;
  }
  std::uint64_t used = used_.load(std::memory_order_relaxed);
  while (used <= options_.max_bytes && least <= options_.max_bytes - used) {
    // At most half of what is free when it cannot all be granted: one
    // request never leaves the other filters nothing.
    const std::uint64_t free = options_.max_bytes - used;
    const std::uint64_t grant = want <= free ? want : std::max(least, free / 2);
    if (used_.compare_exchange_weak(used, used + grant, std::memory_order_relaxed)) return grant;
  }
  refusals_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void MemoryBudget::charge(std::uint64_t bytes) noexcept {
  used_.fetch_add(bytes, std::memory_order_relaxed);
}

void MemoryBudget::release(std::uint64_t bytes) noexcept {
  used_.fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryBudget::settle(std::uint32_t seen_level, std::uint64_t& refusals_seen) noexcept {
  if (options_.max_bytes == 0) return;
  // Refusals since this caller's previous settle() (a tick of its clock).
  const std::uint64_t refusals = refusals_.load(std::memory_order_relaxed);
  const bool refused = std::exchange(refusals_seen, refusals) != refusals;
  if (seen_level == kHold || level() != seen_level) return;
  const auto limit = static_cast<double>(options_.max_bytes);
  const auto fits = [&](std::uint32_t l, double share) {
    return static_cast<double>(demand(l)) <= share * limit;
  };
  if (seen_level == max_level_) note_unmet(!fits(max_level_, 1.0));
  if (seen_level < max_level_ && !fits(seen_level, kFitShare)) {
    // Up to the lowest level that fits at once: a load that keeps rising
    // outruns one step per settle.
    std::uint32_t to = seen_level + 1;
    while (to < max_level_ && !fits(to, kFitShare)) ++to;
    change_level(seen_level, to);
  } else if (seen_level > 0 && !refused && fits(seen_level - 1, kLowerShare)) {
    // Down only while nobody is refused: a saturated filter under-reports
    // what it needs (it inserts little).
    change_level(seen_level, seen_level - 1);
  }
}

void MemoryBudget::change_level(std::uint32_t from, std::uint32_t to) noexcept {
  std::uint32_t expected = from;
  // Only the caller that saw `from` last moves it: a round of settle() by
  // many filters at one level is one step.
  if (!level_.compare_exchange_strong(expected, to, std::memory_order_relaxed)) return;
  if (to < max_level_) unmet_.store(false, std::memory_order_relaxed);
  if (options_.on_change) options_.on_change(change(from, to));
}

MemoryBudget::Change MemoryBudget::change(std::uint32_t from, std::uint32_t to) const noexcept {
  Change c;
  c.level = to;
  c.previous = from;
  c.scale = std::ldexp(1.0, static_cast<int>(to));
  c.used = used();
  c.max_bytes = options_.max_bytes;
  c.demand = demand(to);
  c.filters = members_.load(std::memory_order_relaxed);
  return c;
}

void MemoryBudget::note_unmet(bool unmet) noexcept {
  if (!unmet) {
    unmet_.store(false, std::memory_order_relaxed);
    return;
  }
  // Once per spell: only the caller that set the flag reports.
  if (unmet_.exchange(true, std::memory_order_relaxed) || !options_.on_change) return;
  Change c = change(max_level_, max_level_);
  c.unmet = true;
  options_.on_change(c);
}

std::uint64_t MemoryBudget::expected_demand(std::uint64_t mine) const noexcept {
  const std::uint32_t members = members_.load(std::memory_order_relaxed);
  const std::uint32_t published = publishers_.load(std::memory_order_relaxed);
  const std::uint32_t silent = members > published ? members - published : 0;
  return demand(0) + silent * mine;
}

std::uint32_t MemoryDemand::levels() const noexcept {
  return budget_ && budget_->max_bytes() != 0 ? budget_->max_level() + 1 : 0;
}

void MemoryDemand::publish(std::span<const std::uint64_t> bytes) noexcept {
  const std::size_t n = std::min<std::size_t>(bytes.size(), levels());
  if (n == 0) return;
  if (bytes_.size() != n) {
    withdraw();
    bytes_.assign(n, 0);
  }
  for (std::size_t l = 0; l < n; ++l) {
    if (bytes[l] == bytes_[l]) continue;
    // Unsigned wrap-around adds the difference either way.
    budget_->demand_[l].fetch_add(bytes[l] - bytes_[l], std::memory_order_relaxed);
    bytes_[l] = bytes[l];
  }
  if (!published_) {
    published_ = true;
    budget_->publishers_.fetch_add(1, std::memory_order_relaxed);
  }
}

void MemoryDemand::cap(std::uint64_t bytes) {
  if (!published_) return;
  std::vector<std::uint64_t> capped = bytes_;
  for (std::uint64_t& b : capped) b = std::min(b, bytes);
  publish(capped);
}

void MemoryDemand::withdraw() noexcept {
  if (!budget_) return;
  for (std::size_t l = 0; l < bytes_.size(); ++l) {
    budget_->demand_[l].fetch_sub(bytes_[l], std::memory_order_relaxed);
  }
  bytes_.clear();
  if (published_) {
    published_ = false;
    budget_->publishers_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void MemoryDemand::leave() noexcept {
  withdraw();
  if (budget_) budget_->members_.fetch_sub(1, std::memory_order_relaxed);
  budget_.reset();
}

void MemoryCharge::reset() noexcept {
  if (budget_ && bytes_ != 0) budget_->release(bytes_);
  bytes_ = 0;
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
