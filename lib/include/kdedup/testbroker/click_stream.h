#pragma once
// ClickStream: a reproducible pay-per-click stream with the duplicates seed
// 000 (abstract, §4) motivates: Zipf-popular ads and users whose organic
// repeats collide, client retries that re-send the same click moments later,
// re-posts long after (outside the window: distinct again), and click-fraud
// bursts where one user hammers one ad. The dedup identity is the record key
// "u<user>|a<ad>": the same user clicking the same ad within the window is a
// duplicate. Keys also pick the partition, so duplicates share a partition.
//
// Event timestamps advance evenly over [start_ms, start_ms + span_ms]; a
// retry carries its original click's timestamp (it is the same event).
//
// Owned by one thread.

#include <cstdint>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace kdedup::testbroker {

struct ClickStreamOptions {
  std::uint64_t records = 100'000;
  std::uint64_t users = 50'000;
  std::uint64_t ads = 2'000;
  double zipf_exponent = 1.05;
  double retry_probability = 0.05;   ///< per organic click: re-sent 50 ms..3 s later
  double repost_probability = 0.01;  ///< per organic click: re-posted 30 s..3 min later
  double fraud_probability = 0.002;  ///< per organic click: a burst of 5..40 clicks
  std::int64_t start_ms = 0;
  std::int64_t span_ms = 300'000;
  std::uint64_t seed = 1;
};

struct Click {
  enum class Kind : std::uint8_t { kOrganic, kRetry, kRepost, kFraud };
  std::string key;    ///< "u<user>|a<ad>", the dedup identity
  std::string value;  ///< compact JSON
  std::int64_t timestamp_ms = 0;
  Kind kind = Kind::kOrganic;
};

/// Samples 0..n-1 with P(i) proportional to 1 / (i+1)^s.
class ZipfSampler {
 public:
  ZipfSampler(std::uint64_t n, double s);
  std::uint64_t operator()(std::mt19937_64& rng) const;

 private:
  std::vector<double> cdf_;
};

class ClickStream {
 public:
  explicit ClickStream(const ClickStreamOptions& options);

  /// The next click; false once `records` clicks were produced.
  bool next(Click& out);

  [[nodiscard]] std::uint64_t produced() const noexcept { return produced_; }

 private:
  struct Pending {
    std::int64_t due_ms;  ///< stream time at which it is sent
    Click click;
    bool operator>(const Pending& o) const { return due_ms > o.due_ms; }
  };
  Click make_click(std::uint64_t user, std::uint64_t ad, std::int64_t ts, Click::Kind kind);
  std::int64_t now_ms() const;

  ClickStreamOptions opt_;
  std::mt19937_64 rng_;
  ZipfSampler users_;
  ZipfSampler ads_;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending_;
  std::uint64_t produced_ = 0;
  std::uint64_t next_click_id_ = 0;
};

}  // namespace kdedup::testbroker
