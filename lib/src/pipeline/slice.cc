#include "kdedup/pipeline/slice.h"

#include <algorithm>

#include "kdedup/pipeline/confirm.h"
#include "kdedup/state/confirm_store.h"

namespace kdedup::pipeline {

void PartitionCounters::count_invalid_reason(const std::string& reason) {
  std::lock_guard lock(reasons_mu_);
  ++reasons_[reason];
}

std::map<std::string, std::uint64_t> PartitionCounters::invalid_reasons() const {
  std::lock_guard lock(reasons_mu_);
  return reasons_;
}

PartitionClock::Reading PartitionClock::observe(std::int64_t timestamp_ms,
                                                std::int64_t wall_ms) noexcept {
  if (timestamp_ms <= 0) return Reading::kNoTimestamp;
  Reading reading = Reading::kTimestamp;
  const std::int64_t cap = wall_ms > INT64_MAX - skew_ms_ ? INT64_MAX : wall_ms + skew_ms_;
  if (timestamp_ms > cap) {
    timestamp_ms = cap;
    reading = Reading::kCapped;
  }
  now_ms_ = std::max(now_ms_, timestamp_ms);
  return reading;
}

Result<std::unique_ptr<Slice>> Slice::create(PartitionId id, const SliceOptions& options,
                                             SliceStart start) {
  std::unique_ptr<filter::SlidingFilter> f = std::move(start.filter);
  if (options.filter_enabled && !f) {
    auto made = filter::make_filter(options.filter);
    if (!made) return fail(id.str() + ": cannot create the filter: " + made.error().message);
    f = std::move(*made);
  }
  if (!options.filter_enabled) f.reset();
  auto slice = std::make_unique<Slice>(std::move(id), options, std::move(f), start.clock_ms,
                                       start.next_offset);
  if (slice->failure()) return fail(*slice->failure());
  return slice;
}

ReplayRule::ReplayRule(Below below, std::int64_t committed, std::int64_t rebuild_until,
                       std::vector<std::int64_t> emitted, bool ordered_output, bool refresh)
    : below_(below),
      ordered_output_(ordered_output),
      refresh_(refresh),
      committed_(committed),
      rebuild_until_(std::max(committed, rebuild_until)) {
  const std::int64_t from = below == Below::kSnapshot ? committed_ : INT64_MIN;
  std::erase_if(emitted, [&](std::int64_t o) { return o < from || o >= rebuild_until_; });
  std::sort(emitted.begin(), emitted.end());
  emitted.erase(std::unique(emitted.begin(), emitted.end()), emitted.end());
  emitted_ = std::move(emitted);
}

ReplayRule::Action ReplayRule::action(std::int64_t offset) const noexcept {
  if (offset >= rebuild_until_) return Action::kProcess;
  if (offset < committed_ && below_ == Below::kSnapshot) return Action::kDecide;
  if (std::binary_search(emitted_.begin(), emitted_.end(), offset)) return Action::kLearn;
  // Under refresh a dropped occurrence renewed its identity too.
  if (offset < committed_) return refresh_ ? Action::kLearn : Action::kSkip;
  return ordered_output_ ? Action::kDropped : Action::kProcess;
}

namespace {

// The filter's ticks_per_window over the configured window; passthrough
// (no filter) never asks for ticks, any valid scale does.
filter::TickScale slice_scale(const SliceOptions& options, const filter::SlidingFilter* f) {
  const std::uint32_t ticks = f != nullptr ? f->config().ticks_per_window : 1;
  return filter::TickScale(std::max<std::int64_t>(1, options.window_ms), std::max(1U, ticks));
}

}  // namespace

Slice::Slice(PartitionId id, const SliceOptions& options,
             std::unique_ptr<filter::SlidingFilter> filter, std::int64_t clock_ms,
             std::int64_t next_offset)
    : id_(std::move(id)),
      filter_(std::move(filter)),
      memory_(options.memory),
      filter_config_(options.filter),
      pristine_(filter_ != nullptr && next_offset < 0),
      clock_(options.max_future_skew_ms, clock_ms),
      scale_(slice_scale(options, filter_.get())),
      refresh_(options.refresh),
      next_offset_(next_offset) {
  if (filter_ && options.memory) filter_->set_memory_budget(options.memory);
  counters_->clock_ms.store(clock_ms, std::memory_order_relaxed);
  counters_->next_offset.store(next_offset, std::memory_order_relaxed);
  captures_.last_offset = next_offset;
  if (filter_ && options.confirm != nullptr) {
    // A restored Slice starts at its snapshot's next offset; a new one at -1.
    std::optional<state::ConfirmStore::Restored> restored;
    if (next_offset >= 0) restored = state::ConfirmStore::Restored{next_offset};
    auto attached =
        options.confirm->attach(state::PartitionKey{id_.topic, id_.partition}, scale_, restored);
    if (!attached) {
      failure_ = id_.str() + ": confirmed mode: " + attached.error().message;
    } else {
      confirmer_ = std::make_unique<Confirmer>(std::move(*attached), scale_.ticks_per_window(),
                                               refresh_, counters_);
    }
  }
}

Slice::~Slice() = default;

void Slice::check_quiet(std::int64_t wall_ms) {
  if (last_active_ms_ < 0) last_active_ms_ = wall_ms;  // a spell starts at the first check
  if (!filter_ || parked_) return;
  filter_->flush();
  if (quiet_ || wall_ms - last_active_ms_ < quiet_after_ms()) return;
  filter_->quiet();
  quiet_ = true;
}

bool Slice::park() {
  if (parked_ || !filter_) return false;
  // A wrapper hands over the filter it wraps (freed here) and stays; a
  // plain filter goes itself.
  if (!filter_->exchange_wrapped(nullptr)) filter_.reset();
  parked_ = true;
  counters_->parked.store(true, std::memory_order_relaxed);
  counters_->filter_bytes.store(0, std::memory_order_relaxed);
  counters_->filter_subfilters.store(0, std::memory_order_relaxed);
  return true;
}

void Slice::unpark(std::unique_ptr<filter::SlidingFilter> restored) {
  if (memory_) restored->set_memory_budget(memory_);
  if (filter_) {
    static_cast<void>(filter_->exchange_wrapped(std::move(restored)));
  } else {
    filter_ = std::move(restored);
  }
  parked_ = false;
  counters_->parked.store(false, std::memory_order_relaxed);
  counters_->unparks.fetch_add(1, std::memory_order_relaxed);
}

Status Slice::unpark_new() {
  auto made = filter::make_filter(filter_config_);
  if (!made) return fail("cannot create the filter: " + made.error().message);
  unpark(std::move(*made));
  return {};
}

filter::Tick Slice::observe(std::int64_t timestamp_ms, std::int64_t wall_ms) noexcept {
  switch (clock_.observe(timestamp_ms, wall_ms)) {
    case PartitionClock::Reading::kCapped:
      counters_->clock_capped.fetch_add(1, std::memory_order_relaxed);
      break;
    case PartitionClock::Reading::kNoTimestamp:
      counters_->no_timestamp.fetch_add(1, std::memory_order_relaxed);
      break;
    case PartitionClock::Reading::kTimestamp:
      break;
  }
  counters_->clock_ms.store(clock_.now_ms(), std::memory_order_relaxed);
  return scale_.tick(clock_.now_ms());
}

void Slice::decide(std::span<const filter::Fingerprint> fps, std::span<const filter::Tick> ticks,
                   std::span<filter::Decision> out, std::span<const std::uint8_t> learn,
                   std::span<const std::int64_t> offsets) {
  if (parked_) {
    failure_ = id_.str() +
               ": internal error: records reached the parked filter before it was "
               "restored";
    return;
  }
  if (!filter_) {
    std::fill(out.begin(), out.end(), filter::Decision::kDistinct);
    return;
  }
  if (!fps.empty()) pristine_ = false;
  decide_with_filter(fps, ticks, out, learn);
  if (confirmer_ && !failure_) {
    if (auto settled = confirmer_->settle(*filter_, fps, ticks, offsets, learn, out); !settled) {
      failure_ = id_.str() + ": confirmed mode: " + settled.error().message;
    }
  }
}

void Slice::decide_with_filter(std::span<const filter::Fingerprint> fps,
                               std::span<const filter::Tick> ticks, std::span<filter::Decision> out,
                               std::span<const std::uint8_t> learn) {
  auto decide_run = [this](std::span<const filter::Fingerprint> f, std::span<const filter::Tick> t,
                           std::span<filter::Decision> o) {
    if (refresh_) {
      filter::test_and_refresh_batch(*filter_, f, t, o);
    } else {
      filter_->test_and_insert_batch(f, t, o);
    }
  };
  if (learn.empty()) {
    decide_run(fps, ticks, out);
    return;
  }
  // Runs of decided records in one batch call, learned ones one by one.
  std::size_t i = 0;
  while (i < fps.size()) {
    std::size_t j = i;
    while (j < fps.size() && learn[j] == 0) ++j;
    if (j > i) decide_run(fps.subspan(i, j - i), ticks.subspan(i, j - i), out.subspan(i, j - i));
    for (; j < fps.size() && learn[j] != 0; ++j) {
      filter_->insert(fps[j], ticks[j]);
      out[j] = filter::Decision::kDistinct;
    }
    i = j;
  }
}

void Slice::set_processed(std::int64_t offset) noexcept {
  next_offset_ = offset + 1;
  counters_->next_offset.store(next_offset_, std::memory_order_relaxed);
}

std::uint32_t choose_worker(std::span<const std::uint32_t> slices_per_worker) {
  auto it = std::min_element(slices_per_worker.begin(), slices_per_worker.end());
  return static_cast<std::uint32_t>(it - slices_per_worker.begin());
}

}  // namespace kdedup::pipeline
