// Confirmed mode's decisions for one Slice (kdedup/pipeline/confirm.h).

#include "kdedup/pipeline/confirm.h"

#include <algorithm>
#include <bit>
#include <chrono>

#include "kdedup/state/snapshot_store.h"

namespace kdedup::pipeline {

Result<state::ConfirmStore*> confirm_store_for(const config::Config& config,
                                               state::SnapshotStore* store) {
  if (!config.confirm_store || !config.filter_enabled)
    return static_cast<state::ConfirmStore*>(nullptr);
  if (store == nullptr || store->confirm() == nullptr) {
    return fail(
        "filter.confirm_store: the confirm store was not opened (state.dir must be set and the "
        "snapshot store opened with StoreOptions::confirm)");
  }
  return store->confirm();
}

namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

/// The latest delivery (tick, and which write recorded it) of each
/// fingerprint delivered so far in the current batch: a small open-address
/// table cleared by a stamp, not by a pass over it.
class Confirmer::BatchDeliveries {
 public:
  struct Slot {
    filter::Fingerprint fp;
    filter::Tick tick = 0;
    std::uint32_t write = 0;  ///< index in writes_ of the latest write
    std::uint32_t stamp = 0;  ///< == stamp_: in use in this batch
  };

  void reset(std::size_t records) {
    const std::size_t want = std::bit_ceil(std::max<std::size_t>(64, 2 * records));
    if (slots_.size() < want) {
      slots_.assign(want, Slot{});
      stamp_ = 0;
    }
    if (++stamp_ == 0) {  // wrapped: every old stamp could match again
      std::fill(slots_.begin(), slots_.end(), Slot{});
      stamp_ = 1;
    }
  }

  [[nodiscard]] const Slot* find(const filter::Fingerprint& fp) const {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = fp.lo & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.stamp != stamp_) return nullptr;
      if (s.fp == fp) return &s;
    }
  }

  void put(const filter::Fingerprint& fp, filter::Tick tick, std::uint32_t write) {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = fp.lo & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.stamp != stamp_ || s.fp == fp) {
        s = Slot{fp, tick, write, stamp_};
        return;
      }
    }
  }

 private:
  std::vector<Slot> slots_;
  std::uint32_t stamp_ = 0;
};

Confirmer::Confirmer(std::unique_ptr<state::ConfirmPartition> store, std::uint32_t ticks_per_window,
                     bool refresh, std::shared_ptr<PartitionCounters> counters)
    : store_(std::move(store)),
      ticks_per_window_(ticks_per_window),
      refresh_(refresh),
      counters_(std::move(counters)),
      batch_(std::make_unique<BatchDeliveries>()) {}

Confirmer::~Confirmer() = default;

void Confirmer::deliver(const filter::Fingerprint& fp, filter::Tick tick, std::int64_t offset) {
  batch_->put(fp, tick, static_cast<std::uint32_t>(writes_.size()));
  writes_.push_back({fp, tick, offset});
}

Status Confirmer::settle(filter::SlidingFilter& filter, std::span<const filter::Fingerprint> fps,
                         std::span<const filter::Tick> ticks, std::span<const std::int64_t> offsets,
                         std::span<const std::uint8_t> learn, std::span<filter::Decision> out) {
  const std::size_t n = fps.size();
  if (n == 0) return {};
  ConfirmCounters& counts = counters_->confirm;
  auto learned = [&](std::size_t i) { return !learn.empty() && learn[i] != 0; };

  // 1. Every duplicate the filter found, looked up at once.
  positives_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (!learned(i) && out[i] == filter::Decision::kDuplicate) positives_.push_back(fps[i]);
  }
  found_.assign(positives_.size(), std::nullopt);
  if (!positives_.empty()) {
    const std::int64_t t0 = steady_ns();
    if (auto s = store_->lookup(positives_, found_); !s) return s;
    counts.lookup_times.observe(static_cast<std::uint64_t>(steady_ns() - t0));
    counts.lookups.fetch_add(positives_.size(), std::memory_order_relaxed);
  }

  // 2. Input order: the store's answer, or this batch's own latest delivery.
  // The filter's rule (sliding_filter.h): alive iff now - t <= W.
  auto alive = [this](filter::Tick now, filter::Tick t) { return now - t <= ticks_per_window_; };
  batch_->reset(n);
  writes_.clear();
  const filter::Tick last = ticks[n - 1];
  bool prevented_here = false;
  std::uint64_t prevented = 0;
  std::size_t next_positive = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const filter::Fingerprint& fp = fps[i];
    const filter::Tick t = ticks[i];
    const std::int64_t offset = offsets.empty() ? -1 : offsets[i];
    if (learned(i)) {
      deliver(fp, t, offset);
      continue;
    }
    const BatchDeliveries::Slot* mine = batch_->find(fp);
    if (out[i] == filter::Decision::kDistinct) {
      // The filter had not learned an earlier copy it wrongly called a
      // duplicate in this batch; that copy was delivered all the same.
      if (prevented_here && mine != nullptr && alive(t, mine->tick)) {
        out[i] = filter::Decision::kDuplicate;
        if (refresh_ && mine->tick != t) deliver(fp, t, offset);
      } else {
        deliver(fp, t, offset);
      }
      continue;
    }
    std::optional<filter::Tick> known = found_[next_positive++];
    if (mine != nullptr) known = mine->tick;
    if (known && alive(t, *known)) {
      // Confirmed. on_duplicate: refresh renews the identity here too.
      if (refresh_ && *known != t) deliver(fp, t, offset);
      continue;
    }
    // A false positive of the filter, prevented: the record is distinct.
    out[i] = filter::Decision::kDistinct;
    ++prevented;
    prevented_here = true;
    deliver(fp, t, offset);
    // keep_first: the filter did not insert it; its clock is at `last` now
    // (a later tick only makes the filter remember it a little longer).
    if (!refresh_) filter.insert(fp, last);
  }
  if (prevented != 0) counts.prevented.fetch_add(prevented, std::memory_order_relaxed);
  return write_deliveries(last);
}

Status Confirmer::write_deliveries(filter::Tick last) {
  // One record per fingerprint: its latest delivery of the batch, in input
  // order (the staging keeps offsets in order).
  latest_.clear();
  for (std::size_t j = 0; j < writes_.size(); ++j) {
    const BatchDeliveries::Slot* s = batch_->find(writes_[j].fp);
    if (s != nullptr && s->write == j) latest_.push_back(writes_[j]);
  }
  if (auto s = store_->record(latest_); !s) return s;
  store_->advance(last);
  // The store's size for the metrics, about once a second (a few index
  // lookups in RocksDB).
  const std::int64_t now = steady_ns();
  if (now - last_size_ns_ >= 1'000'000'000) {
    last_size_ns_ = now;
    counters_->confirm.store_bytes.store(store_->approximate_bytes(), std::memory_order_relaxed);
    counters_->confirm.staged.store(store_->staged(), std::memory_order_relaxed);
  }
  return {};
}

}  // namespace kdedup::pipeline
