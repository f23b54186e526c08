#include "kdedup/filter/exact_filter.h"

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"

namespace kdedup::filter {
namespace {
constexpr std::uint16_t kVersion = 1;
}

ExactFilter::ExactFilter(const FilterConfig& config) : config_(config) {}

void ExactFilter::expire(Tick now) {
  const Tick w = config_.ticks_per_window;
  bool erased = false;
  while (!order_.empty() && now - order_.front().tick > w) {
    const Entry& e = order_.front();
    auto it = last_.find(e.fp);
    // A later re-insertion of the same fingerprint owns the map entry now.
    if (it != last_.end() && it->second == e.tick) last_.erase(it);
    order_.pop_front();
    erased = true;
  }
  // The table's buckets never shrink by themselves: after a burst, give the
  // bucket array back once it is 4x what the entries need.
  if (erased && last_.bucket_count() > 4 * std::max<std::size_t>(1024, last_.size())) {
    last_.rehash(0);
  }
}

void ExactFilter::advance(Tick now) {
  if (now > clock_) {
    close_tick(state_bytes());
    clock_ = now;
    // Once per tick, not per record: the table's bytes into the budget, and
    // as its demand at every level (an exact set cannot trade accuracy).
    if (budget_) {
      const std::uint64_t bytes = state_bytes();
      charge_.resize(bytes);
      if (demand_.levels() != 0) {
        const std::vector<std::uint64_t> each(demand_.levels(), bytes);
        demand_.publish(each);
      }
    }
  }
  expire(clock_);
}

void ExactFilter::set_memory_budget(std::shared_ptr<MemoryBudget> budget) {
  charge_ = MemoryCharge();
  budget_ = std::move(budget);
  demand_ = MemoryDemand(budget_);
  if (!budget_) return;
  const std::uint64_t bytes = stats().bytes;
  budget_->charge(bytes);
  charge_ = MemoryCharge(budget_, bytes);
}

bool ExactFilter::contains(const Fingerprint& fp, Tick now) const {
  auto it = last_.find(fp);
  return it != last_.end() && now - it->second <= config_.ticks_per_window;
}

Decision ExactFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  advance(now);
  auto [it, inserted] = last_.try_emplace(fp, clock_);
  if (!inserted) {
    if (clock_ - it->second <= config_.ticks_per_window) return Decision::kDuplicate;
    it->second = clock_;
  }
  order_.push_back(Entry{clock_, fp});
  ++insertions_;
  return Decision::kDistinct;
}

void ExactFilter::insert(const Fingerprint& fp, Tick now) {
  advance(now);
  last_.insert_or_assign(fp, clock_);
  order_.push_back(Entry{clock_, fp});
  ++insertions_;
}

std::uint64_t ExactFilter::state_bytes() const {
  // Node-based map: key + value + next pointer + cached hash, plus buckets.
  constexpr std::uint64_t kNodeBytes = sizeof(Fingerprint) + sizeof(Tick) + 2 * sizeof(void*);
  return last_.size() * kNodeBytes + last_.bucket_count() * sizeof(void*) +
         order_.size() * sizeof(Entry);
}

FilterStats ExactFilter::stats() const {
  FilterStats s;
  s.bytes = state_bytes();
  s.bytes_peak = peak_with(s.bytes);
  s.cells = last_.size();
  s.live_cells = last_.size();
  s.subfilters = 1;
  s.insertions = insertions_;
  s.fpp_estimate = 0.0;
  return s;
}

std::string ExactFilter::serialize() const {
  std::string payload;
  ByteWriter w(payload);
  write_config(w, config_);
  w.put<Tick>(clock_);
  w.put<std::uint64_t>(insertions_);
  w.put<std::uint64_t>(order_.size());
  for (const Entry& e : order_) {
    w.put<Tick>(e.tick);
    w.put<std::uint64_t>(e.fp.lo);
    w.put<std::uint64_t>(e.fp.hi);
  }
  return seal_envelope(static_cast<std::uint16_t>(FilterType::kExact), kVersion, payload);
}

Result<std::unique_ptr<SlidingFilter>> ExactFilter::restore(std::string_view payload,
                                                            std::uint16_t version) {
  if (version != kVersion) {
    return fail("exact filter state: unsupported format version " + std::to_string(version));
  }
  ByteReader r(payload);
  auto config = read_config(r);
  if (!config) return tl::unexpected(config.error());
  if (config->type != FilterType::kExact) return fail("exact filter state: wrong filter type");
  auto f = std::make_unique<ExactFilter>(*config);
  auto clock = r.get<Tick>("clock");
  auto insertions = r.get<std::uint64_t>("insertions");
  auto count = r.get<std::uint64_t>("entry count");
  if (!clock || !insertions || !count) return fail("exact filter state: truncated header");
  if (*count > r.remaining() / 24) return fail("exact filter state: entry count exceeds input");
  f->clock_ = *clock;
  f->insertions_ = *insertions;
  Tick previous = 0;
  for (std::uint64_t i = 0; i < *count; ++i) {
    Entry e{*r.get<Tick>("tick"), {*r.get<std::uint64_t>("fp"), *r.get<std::uint64_t>("fp")}};
    if (e.tick < previous || e.tick > f->clock_) {
      return fail("exact filter state: entries out of time order");
    }
    previous = e.tick;
    f->order_.push_back(e);
    f->last_[e.fp] = e.tick;
  }
  if (auto end = r.expect_end("exact filter state"); !end) return tl::unexpected(end.error());
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
