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
    : shadow_(config), dropped_(config), one_in_(one_in) {}

bool AuditSampler::selects(const filter::Fingerprint& fp) const noexcept {
  return mix64(fp.lo ^ fp.hi) % one_in_ == 0;
}

bool AuditSampler::delivered(const filter::Fingerprint& fp, filter::Tick now) const {
  return shadow_.contains(fp, now);
}

void AuditSampler::record_delivery(const filter::Fingerprint& fp, filter::Tick now) {
  if (selects(fp)) shadow_.insert(fp, now);
}

void AuditSampler::observe(const filter::Fingerprint& fp, filter::Decision decision,
                           filter::Tick now) {
  if (!selects(fp)) return;
  const bool was_delivered = delivered(fp, now);
  // A later copy of an identity whose trial the filter dropped, still
  // undelivered: the same trial, not a new one (see the header).
  const bool same_trial = !was_delivered && dropped_.contains(fp, now);
  AuditCounts c;
  c.sampled = 1;
  if (decision == filter::Decision::kDistinct) {
    // The record is delivered now; a false negative is a real second
    // delivery, so the identity's last delivery moves to now either way.
    shadow_.insert(fp, now);
    c.false_negatives = was_delivered ? 1 : 0;
    c.truly_new = !was_delivered && !same_trial ? 1 : 0;
  } else {
    shadow_.advance(now);  // keep the shadow's memory bounded
    if (!was_delivered) {
      c.false_positive_records = 1;
      if (!same_trial) {
        c.truly_new = 1;
        c.false_positives = 1;
        dropped_.insert(fp, now);
      }
    }
  }
  dropped_.advance(now);
  count(c);
}

void AuditSampler::count(const AuditCounts& c) noexcept {
  for (AuditCounts* to : {&pending_, &totals_}) {
    to->sampled += c.sampled;
    to->truly_new += c.truly_new;
    to->false_positives += c.false_positives;
    to->false_negatives += c.false_negatives;
    to->false_positive_records += c.false_positive_records;
  }
}

std::uint64_t AuditSampler::shadow_bytes() const {
  return shadow_.stats().bytes + dropped_.stats().bytes;
}

AuditCounts AuditSampler::drain() noexcept {
  AuditCounts out = pending_;
  pending_ = AuditCounts{};
  return out;
}

}  // namespace kdedup::metrics
