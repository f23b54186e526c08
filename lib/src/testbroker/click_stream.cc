#include "kdedup/testbroker/click_stream.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kdedup::testbroker {

ZipfSampler::ZipfSampler(std::uint64_t n, double s) {
  cdf_.reserve(n);
  double sum = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    sum += 1.0 / std::pow(static_cast<double>(i + 1), s);
    cdf_.push_back(sum);
  }
  for (auto& c : cdf_) c /= sum;
}

std::uint64_t ZipfSampler::operator()(std::mt19937_64& rng) const {
  double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
  if (it == cdf_.end()) --it;
  return static_cast<std::uint64_t>(it - cdf_.begin());
}

ClickStream::ClickStream(const ClickStreamOptions& options)
    : opt_(options),
      rng_(options.seed),
      users_(std::max<std::uint64_t>(options.users, 1), options.zipf_exponent),
      ads_(std::max<std::uint64_t>(options.ads, 1), options.zipf_exponent) {}

std::int64_t ClickStream::now_ms() const {
  if (opt_.records == 0) return opt_.start_ms;
  return opt_.start_ms + static_cast<std::int64_t>(static_cast<double>(produced_) /
                                                   static_cast<double>(opt_.records) *
                                                   static_cast<double>(opt_.span_ms));
}

Click ClickStream::make_click(std::uint64_t user, std::uint64_t ad, std::int64_t ts,
                              Click::Kind kind) {
  static constexpr const char* kKinds[] = {"organic", "retry", "repost", "fraud"};
  Click c;
  c.key = fmt::format("u{}|a{}", user, ad);
  c.value = fmt::format(R"({{"click":{},"user":{},"ad":{},"ts":{},"kind":"{}"}})", next_click_id_++,
                        user, ad, ts, kKinds[static_cast<int>(kind)]);
  c.timestamp_ms = ts;
  c.kind = kind;
  return c;
}

bool ClickStream::next(Click& out) {
  if (produced_ >= opt_.records) return false;
  const std::int64_t now = now_ms();
  if (!pending_.empty() && pending_.top().due_ms <= now) {
    out = pending_.top().click;
    pending_.pop();
    ++produced_;
    return true;
  }
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const std::uint64_t user = users_(rng_);
  const std::uint64_t ad = ads_(rng_);
  out = make_click(user, ad, now, Click::Kind::kOrganic);
  if (coin(rng_) < opt_.retry_probability) {
    // Same event re-sent: same key, value and timestamp.
    auto delay = std::uniform_int_distribution<std::int64_t>(50, 3'000)(rng_);
    Click retry = out;
    retry.kind = Click::Kind::kRetry;
    pending_.push(Pending{now + delay, std::move(retry)});
  }
  if (coin(rng_) < opt_.repost_probability) {
    auto delay = std::uniform_int_distribution<std::int64_t>(30'000, 180'000)(rng_);
    pending_.push(Pending{now + delay, make_click(user, ad, now + delay, Click::Kind::kRepost)});
  }
  if (coin(rng_) < opt_.fraud_probability) {
    auto burst = std::uniform_int_distribution<int>(5, 40)(rng_);
    const std::uint64_t victim = ads_(rng_);
    std::int64_t t = now;
    for (int i = 0; i < burst; ++i) {
      t += std::uniform_int_distribution<std::int64_t>(20, 800)(rng_);
      pending_.push(Pending{t, make_click(user, victim, t, Click::Kind::kFraud)});
    }
  }
  ++produced_;
  return true;
}

}  // namespace kdedup::testbroker
