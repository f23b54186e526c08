// Time-limited Age-Partitioned Bloom Filter (seed 002 §5-§7); the design and
// its guarantees are documented in aging_filter.h.

#include "kdedup/filter/aging_filter.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"

namespace kdedup::filter {
namespace {

constexpr std::uint16_t kVersion = 1;
constexpr double kLn2 = 0.69314718055994530942;
// Generations close after this many target intervals even when the counter
// has not run out (a falling rate); see aging_filter.h.
constexpr double kGenerationSlack = 1.25;
// A restored filter may not claim more slices than this (corruption guard;
// a real filter stays far below it because s0 grows with the rate).
constexpr std::uint64_t kMaxSlices = 1U << 20;
// Distance, in elements, between prefetching a batch element and using it.
constexpr std::size_t kPrefetchDistance = 8;

__extension__ using Uint128 = unsigned __int128;

// Probability that some k consecutive slices all match, the slices matching
// independently with probabilities `fill` (oldest or newest first: the run
// structure is symmetric). Dynamic programme over the current run length.
double run_probability(const std::vector<double>& fill, std::uint32_t k) {
  if (k == 0 || fill.size() < k) return 0.0;
  std::vector<double> run(k, 0.0), next(k, 0.0);
  run[0] = 1.0;
  double found = 0.0;
  for (double p : fill) {
    std::fill(next.begin(), next.end(), 0.0);
    for (std::uint32_t c = 0; c < k; ++c) {
      if (run[c] == 0.0) continue;
      if (c + 1 == k) {
        found += run[c] * p;
      } else {
        next[c + 1] += run[c] * p;
      }
      next[0] += run[c] * (1.0 - p);
    }
    run.swap(next);
  }
  return found;
}

std::uint64_t slice_bits_at(double capacity, double load) {
  // eq. 8: m = ceil(c / load), load_for()'s load in place of ln 2 (a little
  // under it; more under budget pressure), rounded up to whole 64-bit words.
  const double bits = std::ceil(std::max(capacity, 1.0) / load);
  if (!(bits < static_cast<double>(AgingFilter::kMaxSliceBits))) return AgingFilter::kMaxSliceBits;
  const auto rounded = (static_cast<std::uint64_t>(bits) + 63) / 64 * 64;
  return std::clamp(rounded, AgingFilter::kMinSliceBits, AgingFilter::kMaxSliceBits);
}

}  // namespace

double AgingShape::bits_per_element() const noexcept {
  if (k == 0 || l == 0) return 0.0;
  return static_cast<double>(k + l) * k / (static_cast<double>(l) * kLn2);
}

double aging_worst_case_fpp(std::uint32_t k, std::uint32_t l) noexcept {
  if (k == 0) return 1.0;
  std::vector<double> fill;
  fill.reserve(k + l);
  for (std::uint32_t i = 0; i < k; ++i) fill.push_back(1.0 - std::exp2(-(i + 1.0) / k));
  fill.insert(fill.end(), l, 0.5);
  return run_probability(fill, k);
}

double aging_worst_case_fpp(std::uint32_t k, std::uint32_t l, double load) noexcept {
  if (k == 0) return 1.0;
  std::vector<double> fill;
  fill.reserve(k + l);
  for (std::uint32_t i = 0; i < k; ++i) fill.push_back(1.0 - std::exp(-load * (i + 1.0) / k));
  fill.insert(fill.end(), l, 1.0 - std::exp(-load));
  return run_probability(fill, k);
}

AgingShape choose_aging_shape(double fpp) {
  AgingShape best;
  double best_bits = std::numeric_limits<double>::infinity();
  for (std::uint32_t k = 1; k <= AgingFilter::kMaxK; ++k) {
    // The fpp grows with l (more windows of k slices), the bits per element
    // fall with l: the best l for this k is the largest one within target.
    if (aging_worst_case_fpp(k, 1) > fpp) continue;
    std::uint32_t lo = 1, hi = AgingFilter::kMaxL;
    while (lo < hi) {
      const std::uint32_t mid = (lo + hi + 1) / 2;
      if (aging_worst_case_fpp(k, mid) <= fpp) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const AgingShape candidate{k, lo, aging_worst_case_fpp(k, lo)};
    if (candidate.bits_per_element() < best_bits) {
      best_bits = candidate.bits_per_element();
      best = candidate;
    }
  }
  return best;
}

AgingFilter::Slice AgingFilter::make_slice(std::uint64_t bits, std::uint64_t seq, Tick now) {
  Slice s;
  s.bits = bits;
  s.words.assign(bits / 64, 0);
  s.created = now;
  s.last = now;
  s.tick_base = 0;
  s.seq = seq;
  return s;
}

AgingFilter::AgingFilter(const FilterConfig& config, NoSlices)
    : config_(config), shape_(choose_aging_shape(config.fpp)) {
  const double window = config_.ticks_per_window;
  // An entry is alive for W + 1 tick values; one more tick absorbs the
  // partial ticks at both ends of a generation, so that the slice shifted out
  // of position k + l - 1 has left the window and N settles at k + l.
  target_interval_ = (window + 2.0) / shape_.l;
  generation_limit_ = static_cast<Tick>(std::ceil(kGenerationSlack * target_interval_ + 1.0));
  rate_horizon_ = std::max<Tick>(
      {1, static_cast<Tick>(std::ceil(target_interval_)), static_cast<Tick>(window / 8)});
  load_ = load_for(config_.fpp);
}

AgingFilter::AgingFilter(const FilterConfig& config) : AgingFilter(config, NoSlices{}) {
  // The first k + l slices share the capacity hint (l generations of
  // capacity / l identities, each slice holding k generations), but together
  // never more than the floor: the measured rate sizes every later slice.
  const double generation = static_cast<double>(config_.capacity) / shape_.l;
  const std::uint32_t count = shape_.k + shape_.l;
  const std::uint64_t floor_bits =
      std::max<std::uint64_t>(kMinSliceBits, config_.min_bytes * 8 / count / 64 * 64);
  const std::uint64_t bits = std::min(slice_bits_for(generation * shape_.k), floor_bits);
  slices_.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) slices_.push_back(make_slice(bits, i, 0));
  next_seq_ = count;
  remaining_ = generation_size();
}

std::uint64_t AgingFilter::probe(const Slice& s, const Fingerprint& fp) const noexcept {
  const std::uint64_t j = s.seq % shape_.k;
  const std::uint64_t h = fp.lo + j * fp.hi;
  return static_cast<std::uint64_t>((static_cast<Uint128>(h) * s.bits) >> 64);
}

void AgingFilter::start(Tick now) {
  started_ = true;
  clock_ = now;
  tick_base_ = insertions_;
  for (Slice& s : slices_) {
    s.created = s.last = now;
    s.tick_base = tick_base_;
  }
}

void AgingFilter::move_clock(Tick now) {
  if (!started_) start(now);
  if (now > clock_) {
    close_tick(state_bytes());
    clock_ = now;
    tick_base_ = insertions_;
    observe_budget();
    publish_demand();
    if (denied_) {
      // A shift was refused at the last clock value: ask again at the next
      // insertion.
      denied_ = false;
      remaining_ = 1;
    }
    // eq. 3 as the clock moves, not at the next shift: a generation can
    // last G ticks, and the first window's slices (many, while the rate
    // was learned) were held a few ticks past it (family_bench's Zipf
    // steady stream peaked at 28.1 bits per in-window identity, 22.9 after).
    retire_expired();
  }
}

void AgingFilter::publish_demand() {
  if (level_load_.empty()) return;
  // A window of the current rate (eq. 6's t_span is W + 2 ticks here), at
  // the bits per element of each level's load, or the floor.
  // A saturated filter inserts only the new identities it does not mistake
  // for duplicates: what arrives is what it inserted / (1 - fpp), counted
  // up to twice (as the timer filter's demand), so that the level does not
  // fall while the filter drops most of what arrives.
  const double missed = 1.0 - std::min(0.5, fpp_now());
  const double window_ids = insertion_rate() * (config_.ticks_per_window + 2.0) / missed;
  const double floor = static_cast<double>(config_.min_bytes);
  std::vector<std::uint64_t> bytes(level_load_.size());
  for (std::size_t l = 0; l < level_load_.size(); ++l) {
    const double bits_per_id = static_cast<double>(shape_.k + shape_.l) * shape_.k /
                               (static_cast<double>(shape_.l) * level_load_[l]);
    bytes[l] = static_cast<std::uint64_t>(std::max(floor, window_ids * bits_per_id / 8));
  }
  demand_.publish(bytes);
}

std::uint64_t AgingFilter::slice_bits_for(double capacity) const {
  return slice_bits_at(capacity, load_);
}

double AgingFilter::load_for(double fpp) const {
  // The worst case with kRunHeadroom x l more generations than l in the
  // window: each one is a run of k more slices a query may match (header).
  const auto runs = static_cast<std::uint32_t>(std::ceil((1.0 + kRunHeadroom) * shape_.l));
  double lo = kMinLoad, hi = 32.0 * kLn2;
  if (aging_worst_case_fpp(shape_.k, runs, lo) > fpp) return lo;
  for (int i = 0; i < 48; ++i) {
    const double mid = 0.5 * (lo + hi);
    (aging_worst_case_fpp(shape_.k, runs, mid) <= fpp ? lo : hi) = mid;
  }
  return lo;
}

void AgingFilter::observe_budget() {
  if (!budget_ || !budget_level_.follow(*budget_, clock_, config_.ticks_per_window)) return;
  load_ = load_for(budget_level_.raise(config_.fpp));
  // The current slices may take more (or less) before the next shift.
  if (!denied_) remaining_ = generation_size();
}

bool AgingFilter::reserve(Slice& s, bool required) {
  if (!budget_) return true;
  const std::uint64_t bytes = s.bits / 8;
  if (required) {
    budget_->charge(bytes);
  } else if (!budget_->try_reserve(bytes)) {
    return false;
  }
  s.charge = MemoryCharge(budget_, bytes);
  return true;
}

void AgingFilter::quiet() {
  std::uint64_t held = 0;
  for (const Slice& s : slices_) held += s.bits / 8;
  demand_.cap(held);
}

void AgingFilter::set_memory_budget(std::shared_ptr<MemoryBudget> budget) {
  budget_ = std::move(budget);
  demand_ = MemoryDemand(budget_);
  level_load_.clear();
  for (std::uint32_t l = 0; l < demand_.levels(); ++l) {
    level_load_.push_back(
        load_for(effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(l)))));
  }
  for (Slice& s : slices_) {
    s.charge = MemoryCharge();
    (void)reserve(s, true);
  }
  budget_level_.reset(0, clock_);
  load_ = load_for(config_.fpp);
  observe_budget();
}

bool AgingFilter::contains(const Fingerprint& fp, Tick now) const {
  if (started_ && now < clock_) now = clock_;
  const auto matches = [&](std::size_t p) {
    const Slice& s = at(p);
    if (!in_window(s, now)) return false;
    const std::uint64_t pos = probe(s, fp);
    return ((s.words[pos >> 6] >> (pos & 63)) & 1U) != 0;
  };
  const std::int64_t k = shape_.k;
  // Recent duplicates sit in s0..s_{k-1}, whose lines the batch prefetched:
  // try that window first. Any order of windows gives the same answer.
  std::int64_t c = 0;
  while (c < k && matches(static_cast<std::size_t>(c))) ++c;
  if (c == k) return true;
  // Algorithm 1 (seed 002 §6.4): from the oldest window down, k consecutive
  // in-window matches; on a miss jump k slices younger, keeping the matches
  // found (they end right below the new window's top).
  std::int64_t i = static_cast<std::int64_t>(slices_.size()) - k;
  std::int64_t p = 0;
  c = 0;
  while (i >= 0) {
    if (matches(static_cast<std::size_t>(i))) {
      ++c;
      ++i;
      if (p + c == k) return true;
    } else {
      i -= k;
      p = c;
      c = 0;
    }
  }
  return false;
}

void AgingFilter::write_bits(const Fingerprint& fp) {
  for (std::uint32_t p = 0; p < shape_.k; ++p) {
    Slice& s = at(p);
    const std::uint64_t pos = probe(s, fp);
    std::uint64_t& word = s.words[pos >> 6];
    const std::uint64_t mask = std::uint64_t{1} << (pos & 63);
    if ((word & mask) == 0) {
      word |= mask;
      ++s.ones;
    }
    ++s.inserted;
    s.last = clock_;
  }
  ++at(0).generation;
  ++insertions_;
  if (--remaining_ == 0) (void)shift();
}

void AgingFilter::close_stale_generation() {
  Slice& s0 = at(0);
  if (!denied_ && clock_ - s0.created >= generation_limit_) {
    // An idle generation just restarts: an empty slice would only waste memory.
    if (s0.generation > 0) {
      (void)shift();
    } else {
      // The slice is empty, so its newest-insertion tick moves with its
      // creation tick (serialized state requires created <= last).
      s0.created = s0.last = clock_;
      s0.tick_base = tick_base_;
    }
  }
}

Decision AgingFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  move_clock(now);
  close_stale_generation();
  if (contains(fp, clock_)) return Decision::kDuplicate;
  write_bits(fp);
  return Decision::kDistinct;
}

void AgingFilter::insert(const Fingerprint& fp, Tick now) {
  move_clock(now);
  close_stale_generation();
  write_bits(fp);
}

void AgingFilter::prefetch(const Fingerprint& fp) const {
  for (std::uint32_t p = 0; p < shape_.k; ++p) {
    const Slice& s = at(p);
    __builtin_prefetch(&s.words[probe(s, fp) >> 6], 1);
  }
}

void AgingFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                        std::span<const Tick> ticks, std::span<Decision> out) {
  const std::size_t n = fps.size();
  for (std::size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) prefetch(fps[i]);
  for (std::size_t i = 0; i < n; ++i) {
    // A shift between prefetch and use only makes the hint useless.
    if (i + kPrefetchDistance < n) prefetch(fps[i + kPrefetchDistance]);
    out[i] = test_and_insert(fps[i], ticks[i]);
  }
}

void AgingFilter::advance(Tick now) {
  move_clock(now);
  retire_expired();
}

void AgingFilter::retire_expired() {
  // eq. 3: only slices whose newest insertion left the window, and never
  // below k + l. Newest-insertion ticks grow from the front to the back.
  const std::size_t base = shape_.k + shape_.l;
  std::size_t expired = 0;
  while (slices_.size() - expired > base && !in_window(slices_[expired], clock_)) ++expired;
  slices_.erase(slices_.begin(), slices_.begin() + static_cast<std::ptrdiff_t>(expired));
}

double AgingFilter::insertion_rate() const {
  // eq. 6's g / t_s over whole ticks: from the start of the tick in which a
  // recent generation began to the start of the current tick, going back
  // until that spans rate_horizon_ ticks or the oldest slice is reached. A
  // generation reaching back more than twice that spans an idle gap: when
  // younger history exists, the rate is taken from it alone.
  const Slice* from = nullptr;
  for (std::size_t p = 0; p < slices_.size(); ++p) {
    const Slice& s = at(p);
    const Tick span = clock_ - s.created;
    if (span == 0) continue;
    if (from != nullptr && span > 2 * rate_horizon_) break;
    from = &s;
    if (span >= rate_horizon_) break;
  }
  // This tick's insertions so far are a lower bound on the rate: after an
  // idle gap the history says "almost nothing", and trusting it alone would
  // make every new s0 minimal and multiply the slices while traffic resumes.
  const auto this_tick = static_cast<double>(insertions_ - tick_base_);
  if (from == nullptr) return this_tick;
  const double history = static_cast<double>(tick_base_ - from->tick_base) /
                         static_cast<double>(clock_ - from->created);
  if (this_tick <= history) return history;
  // Past the first window, onto a window holding more than this tick
  // brought, the bound is capped: eq. 6's generation (seed 002 §6) then
  // takes at most kSurgeStep times the window's share of one. A burst of
  // 100k new identities within one tick onto 96k a window was taken for a
  // whole generation at its rate: the tick's last slices were sized for
  // millions, 5.45x the pre-sized bits for the most the window held.
  // Capped, the tick shifts a dozen times more, each slice sized for what
  // it takes (1.43x), and whole ticks size the next ones. A query matches
  // k consecutive in-window slices, so each generation the window holds
  // past l raises the estimate at the slices' design fill: the cap trades
  // memory for it (at 1.5x the share, 1.18x and an estimate of 1.58x the
  // target for the burst's tick; at 4x, 1.35x; before, 1.23x; all with
  // slices sized at ln 2: kRunHeadroom now holds the estimate within it).
  double holds = 0;
  for (const Slice& s : slices_) {
    if (in_window(s, clock_)) holds += static_cast<double>(s.generation);
  }
  const bool settled =
      holds > this_tick && clock_ - slices_.front().created > config_.ticks_per_window;
  if (!settled) return this_tick;
  return std::max(history,
                  std::min(this_tick, kSurgeStep * holds / (config_.ticks_per_window + 2.0)));
}

std::uint64_t AgingFilter::generation_size() const {
  // eq. 4-5: the insertions every one of s0..s_{k-1} can still take before
  // reaching the design load (n = m load: fill a little under 1/2), spread
  // over the shifts it has left.
  double g = std::numeric_limits<double>::infinity();
  for (std::uint32_t p = 0; p < shape_.k; ++p) {
    const Slice& s = at(p);
    const double room = std::max(0.0, static_cast<double>(s.bits) * load_ - s.inserted);
    g = std::min(g, std::floor(room / (shape_.k - p)));
  }
  // A full slice still advances: shifting is what makes room.
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(g));
}

bool AgingFilter::shift() {
  // eq. 6 (with t_span / l = target_interval_): target generation size.
  const double tg = insertion_rate() * target_interval_;
  // eq. 7: after the shift, today's s0..s_{k-2} sit at 1..k-1. The one that
  // fills first (j) bounds the next generations; the new s0 takes its
  // remaining room `count` plus j generations of tg, and never more than k
  // generations of tg.
  const std::uint32_t k = shape_.k;
  double capacity = k * tg;
  double fewest = std::numeric_limits<double>::infinity();
  for (std::uint32_t i = 1; i < k; ++i) {
    const Slice& s = at(i - 1);
    const double room = std::max(0.0, static_cast<double>(s.bits) * load_ - s.inserted);
    const double updates = std::floor(room / (k - i));
    if (updates < fewest) {
      fewest = updates;
      capacity = std::min(k * tg, room + i * tg);
    }
  }
  Slice s0 = make_slice(slice_bits_for(capacity), next_seq_, clock_);
  // The slices this shift retires (beyond k + l with s0, and out of the
  // window) give their bytes back right after: a new s0 that fits in them is
  // charged whatever the budget, so a filter at the limit still turns over
  // (and shrinks when the rate fell) instead of holding its old slices.
  const std::size_t base = shape_.k + shape_.l;
  std::uint64_t freed = 0;
  for (std::size_t i = 0; slices_.size() + 1 - i > base && !in_window(slices_[i], clock_); ++i) {
    freed += slices_[i].bits / 8;
  }
  if (!reserve(s0, s0.bits / 8 <= freed)) {
    // Over budget: the generation stays open until the next tick.
    denied_ = true;
    remaining_ = std::numeric_limits<std::uint64_t>::max();
    return false;
  }
  ++next_seq_;
  slices_.push_back(std::move(s0));
  slices_.back().tick_base = tick_base_;
  retire_expired();
  remaining_ = generation_size();
  return true;
}

double AgingFilter::fpp_now() const {
  std::vector<double> fill;
  fill.reserve(slices_.size());
  for (const Slice& s : slices_) {
    fill.push_back(in_window(s, clock_) ? static_cast<double>(s.ones) / s.bits : 0.0);
  }
  return run_probability(fill, shape_.k);
}

std::uint64_t AgingFilter::state_bytes() const {
  std::uint64_t bytes = sizeof(*this) + slices_.capacity() * sizeof(Slice);
  for (const Slice& s : slices_) bytes += s.words.size() * sizeof(std::uint64_t);
  return bytes;
}

FilterStats AgingFilter::stats() const {
  FilterStats st;
  st.bytes = state_bytes();
  st.bytes_peak = peak_with(st.bytes);
  for (const Slice& s : slices_) {
    st.cells += s.bits;
    st.live_cells += s.ones;
  }
  st.subfilters = static_cast<std::uint32_t>(slices_.size());
  st.insertions = insertions_;
  st.fpp_estimate = fpp_now();
  st.slice0_bits = at(0).bits;
  return st;
}

std::string AgingFilter::serialize() const {
  std::string payload;
  ByteWriter w(payload);
  write_config(w, config_);
  w.put<std::uint32_t>(shape_.k);
  w.put<std::uint32_t>(shape_.l);
  w.put<std::uint8_t>(started_ ? 1 : 0);
  w.put<Tick>(clock_);
  w.put<std::uint64_t>(insertions_);
  w.put<std::uint64_t>(tick_base_);
  w.put<std::uint64_t>(denied_ ? 1 : remaining_);  // a refused shift is asked for again
  w.put<std::uint64_t>(next_seq_);
  w.put<std::uint64_t>(slices_.size());
  for (const Slice& s : slices_) {  // oldest first
    w.put<std::uint64_t>(s.seq);
    w.put<Tick>(s.created);
    w.put<std::uint64_t>(s.tick_base);
    w.put<Tick>(s.last);
    w.put<std::uint64_t>(s.inserted);
    w.put<std::uint64_t>(s.generation);
    w.put<std::uint64_t>(s.ones);
    w.put<std::uint64_t>(s.bits);
    for (std::uint64_t word : s.words) w.put<std::uint64_t>(word);
  }
  return seal_envelope(static_cast<std::uint16_t>(FilterType::kAging), kVersion, payload);
}

Result<std::unique_ptr<SlidingFilter>> AgingFilter::restore(std::string_view payload,
                                                            std::uint16_t version) {
  const std::string what = "aging filter state: ";
  if (version != kVersion) {
    return fail(what + "unsupported format version " + std::to_string(version));
  }
  ByteReader r(payload);
  auto config = read_config(r);
  if (!config) return tl::unexpected(config.error());
  if (config->type != FilterType::kAging) return fail(what + "wrong filter type in config");
  std::unique_ptr<AgingFilter> f(new AgingFilter(*config, NoSlices{}));

  auto k = r.get<std::uint32_t>("k");
  auto l = r.get<std::uint32_t>("l");
  auto started = r.get<std::uint8_t>("started");
  auto clock = r.get<Tick>("clock");
  auto insertions = r.get<std::uint64_t>("insertions");
  auto tick_base = r.get<std::uint64_t>("tick base");
  auto remaining = r.get<std::uint64_t>("remaining");
  auto next_seq = r.get<std::uint64_t>("next_seq");
  auto count = r.get<std::uint64_t>("slice count");
  if (!k || !l || !started || !clock || !insertions || !tick_base || !remaining || !next_seq ||
      !count) {
    return fail(what + "truncated header");
  }
  // (k, l) follow from the config; a mismatch means the blob was written by
  // a different shape rule and would decide differently.
  if (*k != f->shape_.k || *l != f->shape_.l) {
    return fail(what + "(k, l) = (" + std::to_string(*k) + ", " + std::to_string(*l) +
                ") does not match the configured fpp, which gives (" + std::to_string(f->shape_.k) +
                ", " + std::to_string(f->shape_.l) + ")");
  }
  if (*started > 1) return fail(what + "bad started flag");
  if (!*started && (*clock != 0 || *insertions != 0)) {
    return fail(what + "clock or insertions set before the first tick");
  }
  if (*remaining == 0) return fail(what + "generation counter is 0");
  if (*tick_base > *insertions) return fail(what + "tick base beyond the insertions");
  const std::uint64_t base = *k + *l;
  constexpr std::uint64_t kSliceHeader = 8 * sizeof(std::uint64_t);
  if (*count < base || *count > kMaxSlices) {
    return fail(what + "slice count " + std::to_string(*count) + " outside [" +
                std::to_string(base) + ", " + std::to_string(kMaxSlices) + "]");
  }
  if (*count > r.remaining() / kSliceHeader) return fail(what + "slice count exceeds input");
  if (*next_seq < *count) return fail(what + "slice numbering before the first slice");

  std::vector<Slice> slices;
  slices.reserve(*count);
  for (std::uint64_t i = 0; i < *count; ++i) {
    const std::string where = what + "slice " + std::to_string(i) + ": ";
    auto seq = r.get<std::uint64_t>("slice seq");
    auto created = r.get<Tick>("slice created");
    auto slice_base = r.get<std::uint64_t>("slice tick base");
    auto last = r.get<Tick>("slice last");
    auto inserted = r.get<std::uint64_t>("slice inserted");
    auto generation = r.get<std::uint64_t>("slice generation");
    auto ones = r.get<std::uint64_t>("slice ones");
    auto bits = r.get<std::uint64_t>("slice bits");
    if (!seq || !created || !slice_base || !last || !inserted || !generation || !ones || !bits) {
      return fail(where + "truncated header");
    }
    // Slices are created with consecutive numbers and leave oldest first.
    if (*seq != *next_seq - *count + i) return fail(where + "out of sequence");
    if (*bits < kMinSliceBits || *bits > kMaxSliceBits || *bits % 64 != 0) {
      return fail(where + "size " + std::to_string(*bits) + " bits is not a multiple of 64 in [" +
                  std::to_string(kMinSliceBits) + ", " + std::to_string(kMaxSliceBits) + "]");
    }
    if (*created > *last || *last > *clock) return fail(where + "ticks out of order");
    if (*slice_base > *tick_base) return fail(where + "tick base beyond the filter's");
    if (!slices.empty() && (*last < slices.back().last || *created < slices.back().created ||
                            *slice_base < slices.back().tick_base)) {
      return fail(where + "younger than the slice before it");
    }
    if (*generation > *inserted) return fail(where + "generation larger than its insertions");
    if (*ones > *bits || *ones > *inserted) return fail(where + "more set bits than possible");
    if (*bits / 64 > r.remaining() / sizeof(std::uint64_t)) return fail(where + "truncated bits");
    Slice s;
    s.seq = *seq;
    s.created = *created;
    s.tick_base = *slice_base;
    s.last = *last;
    s.inserted = *inserted;
    s.generation = *generation;
    s.ones = *ones;
    s.bits = *bits;
    s.words.resize(*bits / 64);
    std::uint64_t popcount = 0;
    for (std::uint64_t& word : s.words) {
      word = *r.get<std::uint64_t>("slice word");
      popcount += static_cast<std::uint64_t>(std::popcount(word));
    }
    if (popcount != s.ones) return fail(where + "set-bit count does not match its bits");
    slices.push_back(std::move(s));
  }
  if (auto end = r.expect_end("aging filter state"); !end) return tl::unexpected(end.error());
  f->slices_ = std::move(slices);
  f->started_ = *started != 0;
  f->clock_ = *clock;
  f->insertions_ = *insertions;
  f->tick_base_ = *tick_base;
  f->remaining_ = *remaining;
  f->next_seq_ = *next_seq;
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
