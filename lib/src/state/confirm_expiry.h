#pragma once
// Internal: expiry of the confirm store's entries by compaction (seed 003
// §5: items are forgotten after their TTL). Each partition has an expiry
// horizon, a tick of its own time -> tick mapping; an entry whose tick is
// more than one window older than the horizon is dropped when RocksDB
// compacts the file that holds it. No scan per tick, no write per expiry.
//
// The horizon only ever moves forward and is never ahead of any clock a
// later decision can be made at: in staged mode it is the clock of the
// partition's latest bound snapshot (every Slice that can still look the
// entry up starts at or after it), in direct mode the live partition clock.
// Dropping an entry that old changes no decision: a lookup at such a clock
// already finds it expired. Dropping the newest version of a key can expose
// an older one in a lower level; that one is older still, so also expired.
//
// Threads: the registry is shared by the store (set_horizon, any thread)
// and RocksDB's compaction threads (the factory copies the table of
// partitions at the start of each compaction; horizons are atomics).

#include <rocksdb/compaction_filter.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "kdedup/filter/sliding_filter.h"

namespace kdedup::state::confirm {

/// One partition's expiry state.
struct PartitionExpiry {
  std::atomic<std::uint64_t> horizon{0};
  std::uint32_t ticks_per_window = 0;
};

class ExpiryRegistry {
 public:
  /// The expiry state of partition `id` (created on first use).
  std::shared_ptr<PartitionExpiry> partition(std::uint32_t id, std::uint32_t ticks_per_window);
  /// Moves the horizon of `id` forward to `tick` (never back).
  void set_horizon(std::uint32_t id, filter::Tick tick);
  /// Starts partition `id` over (its entries were all deleted).
  void reset(std::uint32_t id, std::uint32_t ticks_per_window);

  using Table = std::map<std::uint32_t, std::shared_ptr<PartitionExpiry>>;
  [[nodiscard]] Table copy() const;

 private:
  mutable std::mutex mu_;
  Table table_;
};

/// RocksDB's hook: one filter per compaction, over the registry's table.
class ExpiryFilterFactory final : public rocksdb::CompactionFilterFactory {
 public:
  explicit ExpiryFilterFactory(std::shared_ptr<ExpiryRegistry> registry)
      : registry_(std::move(registry)) {}
  std::unique_ptr<rocksdb::CompactionFilter> CreateCompactionFilter(
      const rocksdb::CompactionFilter::Context& context) override;
  const char* Name() const override { return "kdedup.ConfirmExpiry"; }

  /// Entries dropped by compactions so far (benchmarks, logs).
  [[nodiscard]] std::uint64_t dropped() const noexcept {
    return dropped_->load(std::memory_order_relaxed);
  }

 private:
  std::shared_ptr<ExpiryRegistry> registry_;
  std::shared_ptr<std::atomic<std::uint64_t>> dropped_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
};

}  // namespace kdedup::state::confirm
