#include "kdedup/metrics/audit_sampler.h"

#include <algorithm>

namespace kdedup::metrics {
namespace {

// splitmix64's finaliser: a bijection with full avalanche, so every output
// bit depends on every input bit (see the selection note in the header).
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

Result<AuditSampler> AuditSampler::create(std::uint32_t ticks_per_window, std::uint32_t one_in) {
  if (one_in == 0) return fail("audit sampler: one_in must be at least 1 (got 0)");
  if (ticks_per_window == 0) {
    return fail("audit sampler: ticks_per_window must be the audited filter's, at least 1");
  }
  filter::FilterConfig config;
  config.type = filter::FilterType::kExact;
  config.ticks_per_window = ticks_per_window;
  auto normalized = filter::normalize(config);
  if (!normalized) return fail("audit sampler: " + normalized.error().message);
  return AuditSampler(*normalized, one_in);
}

AuditSampler::AuditSampler(const filter::FilterConfig& config, std::uint32_t one_in)
    : shadow_(config), ticks_per_window_(config.ticks_per_window), one_in_(one_in) {}

bool AuditSampler::selects(const filter::Fingerprint& fp) const noexcept {
  return mix64(fp.lo ^ fp.hi) % one_in_ == 0;
}

bool AuditSampler::delivered(const filter::Fingerprint& fp, filter::Tick now) const {
  if (shadow_.contains(fp, now)) return true;
  auto it = redelivered_.find(fp);
  return it != redelivered_.end() && now - it->second <= ticks_per_window_;
}

void AuditSampler::sweep_redelivered(filter::Tick now) {
  if (redelivered_.size() < sweep_at_) return;
  std::erase_if(redelivered_, [&](const auto& e) { return now - e.second > ticks_per_window_; });
  // Doubling keeps the sweeps amortised O(1) per insertion.
  sweep_at_ = std::max<std::size_t>(64, 2 * redelivered_.size());
}

void AuditSampler::observe(const filter::Fingerprint& fp, filter::Decision decision,
                           filter::Tick now) {
  if (!selects(fp)) return;
  const bool was_delivered = delivered(fp, now);
  ++pending_.sampled;
  ++totals_.sampled;
  if (decision == filter::Decision::kDistinct) {
    // The record is delivered now. The shadow inserts it unless it still
    // holds a live earlier delivery; then the new one is kept beside it.
    if (shadow_.test_and_insert(fp, now) == filter::Decision::kDuplicate) {
      redelivered_[fp] = now;
      sweep_redelivered(now);
    } else {
      redelivered_.erase(fp);
    }
    if (was_delivered) {
      ++pending_.false_negatives;
      ++totals_.false_negatives;
    } else {
      ++pending_.truly_new;
      ++totals_.truly_new;
    }
    return;
  }
  shadow_.advance(now);  // keep the shadow's memory bounded
  if (!was_delivered) {
    ++pending_.truly_new;
    ++totals_.truly_new;
    ++pending_.false_positives;
    ++totals_.false_positives;
  }
}

std::uint64_t AuditSampler::shadow_bytes() const {
  constexpr std::uint64_t kNodeBytes =
      sizeof(filter::Fingerprint) + sizeof(filter::Tick) + 2 * sizeof(void*);
  return shadow_.stats().bytes + redelivered_.size() * kNodeBytes +
         redelivered_.bucket_count() * sizeof(void*);
}

AuditCounts AuditSampler::drain() noexcept {
  AuditCounts out = pending_;
  pending_ = AuditCounts{};
  return out;
}

}  // namespace kdedup::metrics
