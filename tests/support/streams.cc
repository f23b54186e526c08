#include "streams.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "kdedup/filter/aging_filter.h"
#include "kdedup/filter/compact_filter.h"
#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/timer_filter.h"

namespace kdedup::testing {
namespace {

// SplitMix64's finalizer: a bijection on 64-bit values with good avalanche.
std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

double rate_at(const StreamSpec& spec, std::uint64_t i) {
  const std::uint64_t third = spec.ticks / 3;
  const bool in_burst = i >= third && i < 2 * third;
  return in_burst ? spec.base_rate * spec.burst_factor : spec.base_rate;
}

Fingerprint identity_fingerprint(std::uint64_t id, std::uint64_t seed) {
  const std::uint64_t lo = mix64(id ^ mix64(seed + 0x9E3779B97F4A7C15ULL));
  return Fingerprint{lo, mix64(lo + 0x6A09E667F3BCC909ULL)};
}

EventStream::EventStream(const StreamSpec& spec) : spec_(spec), rng_(spec.seed) {
  if (spec_.domain == 0) spec_.domain = 1;
  if (spec_.distribution == Distribution::kZipf) {
    // Inverse-CDF table: P(rank r) proportional to 1 / r^alpha.
    zipf_cdf_.resize(spec_.domain);
    double sum = 0.0;
    for (std::uint64_t r = 0; r < spec_.domain; ++r) {
      sum += 1.0 / std::pow(static_cast<double>(r + 1), spec_.zipf_alpha);
      zipf_cdf_[r] = sum;
    }
    for (double& c : zipf_cdf_) c /= sum;
  }
}

std::uint64_t EventStream::draw_identity() {
  if (spec_.distribution == Distribution::kUniform) {
    return std::uniform_int_distribution<std::uint64_t>(0, spec_.domain - 1)(rng_);
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  auto it = std::lower_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u);
  if (it == zipf_cdf_.end()) --it;
  return static_cast<std::uint64_t>(it - zipf_cdf_.begin());
}

bool EventStream::next(Event& out) {
  if (started_) {
    if (left_in_tick_ == 0) ++tick_index_;
  } else {
    started_ = true;
  }
  // Skip ticks that receive no event (fractional rates).
  while (left_in_tick_ == 0) {
    if (tick_index_ >= spec_.ticks) return false;
    carry_ += rate_at(spec_, tick_index_);
    const double whole = std::floor(carry_);
    left_in_tick_ = static_cast<std::uint64_t>(whole);
    carry_ -= whole;
    if (left_in_tick_ == 0) ++tick_index_;
  }
  --left_in_tick_;
  out.tick = spec_.first_tick + tick_index_;
  out.fp = identity_fingerprint(draw_identity(), spec_.seed);
  return true;
}

std::vector<Event> generate_stream(const StreamSpec& spec) {
  std::vector<Event> events;
  double expected = 0.0;
  for (std::uint64_t i = 0; i < spec.ticks; ++i) expected += rate_at(spec, i);
  events.reserve(static_cast<std::size_t>(expected) + 1);
  EventStream stream(spec);
  Event e;
  while (stream.next(e)) events.push_back(e);
  return events;
}

std::uint64_t presized_bytes(filter::FilterConfig c, std::uint64_t ids) {
  c.capacity = ids;
  auto normal = filter::normalize(c);
  if (!normal) return 0;
  switch (c.type) {
    case filter::FilterType::kTimer: {
      auto t = filter::TimerFilter::create_presized(*normal);
      return t ? (*t)->presized_bytes() : 0;
    }
    case filter::FilterType::kCompact: {
      auto t = filter::CompactFilter::create_presized(*normal);
      return t ? (*t)->table_bytes().front() : 0;
    }
    case filter::FilterType::kAging:
      return static_cast<std::uint64_t>(static_cast<double>(ids) *
                                        filter::choose_aging_shape(c.fpp).bits_per_element() / 8);
    default:
      return 0;
  }
}

std::vector<Event> short_burst_stream(std::uint32_t window, double per_window, double burst,
                                      std::uint64_t ticks) {
  StreamSpec base;
  base.domain = std::uint64_t{1} << 40;  // every draw new
  base.base_rate = per_window / (window + 1);
  base.ticks = 7 * (std::uint64_t{window} + 1);
  base.seed = 7;
  StreamSpec step = base;
  step.base_rate = burst / static_cast<double>(ticks);
  step.first_tick = 3 * (std::uint64_t{window} + 1);
  step.ticks = ticks;
  step.seed = 8;
  std::vector<Event> events = generate_stream(base);
  const std::vector<Event> more = generate_stream(step);
  events.insert(events.end(), more.begin(), more.end());
  std::stable_sort(events.begin(), events.end(),
                   [](const Event& a, const Event& b) { return a.tick < b.tick; });
  return events;
}

void lay_on_ticks(std::vector<Event>& events, std::uint32_t window) {
  for (Event& e : events) e.tick = e.tick * window / kFineTicksPerWindow;
}

std::size_t most_within(const std::vector<std::int64_t>& stamps, std::int64_t window_ms) {
  std::size_t most = 0;
  for (std::size_t lo = 0, hi = 0; hi < stamps.size(); ++hi) {
    while (stamps[lo] <= stamps[hi] - window_ms) ++lo;
    most = std::max(most, hi - lo + 1);
  }
  return most;
}

double OracleCounts::fp_rate() const {
  const std::uint64_t not_delivered = true_negatives + false_positives;
  return not_delivered == 0
             ? 0.0
             : static_cast<double>(false_positives) / static_cast<double>(not_delivered);
}

double OracleCounts::first_query_fp_rate() const {
  return first_queries == 0 ? 0.0
                            : static_cast<double>(first_query_false_positives) /
                                  static_cast<double>(first_queries);
}

bool closes_tick(std::span<const Event> events, std::size_t i) {
  return i + 1 == events.size() || events[i + 1].tick != events[i].tick;
}

OracleCounts run_against_oracle(filter::SlidingFilter& f, std::span<const Event> events,
                                std::size_t batch, const OracleObserver& observer,
                                bool tick_chunks) {
  filter::FilterConfig oracle_config;
  oracle_config.type = filter::FilterType::kExact;
  oracle_config.ticks_per_window = f.config().ticks_per_window;
  filter::ExactFilter oracle(oracle_config);

  OracleCounts counts;
  // Identities queried while not delivered since their last delivery.
  std::unordered_set<Fingerprint, filter::FingerprintHash> asked;
  if (batch == 0) batch = 1;
  std::vector<Fingerprint> fps;
  std::vector<Tick> ticks;
  std::vector<filter::Decision> decisions;
  for (std::size_t start = 0, n = 0; start < events.size(); start += n) {
    n = std::min(batch, events.size() - start);
    if (tick_chunks) {
      for (std::size_t j = 1; j < n; ++j) {
        if (events[start + j].tick != events[start].tick) {
          n = j;
          break;
        }
      }
    }
    decisions.resize(n);
    if (n == 1 && batch == 1) {
      decisions[0] = f.test_and_insert(events[start].fp, events[start].tick);
    } else {
      fps.resize(n);
      ticks.resize(n);
      for (std::size_t j = 0; j < n; ++j) {
        fps[j] = events[start + j].fp;
        ticks[j] = events[start + j].tick;
      }
      f.test_and_insert_batch(fps, ticks, decisions);
    }
    for (std::size_t j = 0; j < n; ++j) {
      const Event& e = events[start + j];
      const bool delivered = oracle.contains(e.fp, e.tick);
      const bool duplicate = decisions[j] == filter::Decision::kDuplicate;
      ++counts.events;
      if (!delivered && asked.insert(e.fp).second) {
        ++counts.first_queries;
        counts.first_query_false_positives += duplicate ? 1 : 0;
      }
      if (duplicate) {
        delivered ? ++counts.true_positives : ++counts.false_positives;
      } else {
        delivered ? ++counts.false_negatives : ++counts.true_negatives;
        // A false negative is a real re-delivery: the last delivery moves.
        oracle.insert(e.fp, e.tick);
        asked.erase(e.fp);  // its next absence is a new one
      }
      if (observer) observer(start + j, e, decisions[j], delivered);
    }
  }
  return counts;
}

}  // namespace kdedup::testing
