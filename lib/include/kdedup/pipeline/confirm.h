#pragma once
// Confirmer: confirmed mode's decisions for one Slice (seed 003 §5: "false
// positives ... trigger a secondary check (an exact lookup)"; DESIGN.md
// "Confirmed mode"). After the Slice's filter decided a batch, every record
// it judged a duplicate is looked up in the partition's exact store
// (state::ConfirmPartition): present and delivered within the window ->
// duplicate; absent or expired -> distinct, a prevented false positive, and
// the filter learns it. Every delivery (and, with on_duplicate: refresh,
// every renewal) is recorded in the store. The decisions are then exactly
// those of an exact filter with the same ticks: the filter never forgets a
// delivery inside the window (no false negatives), and the store confirms
// each of its positives.
//
// Per batch: one lookup call for all the positives (staged deliveries, then
// one RocksDB MultiGet), then one pass in input order that also sees the
// batch's own deliveries (a record whose earlier copy in the same batch was
// a prevented false positive, which the filter did not learn in time), and
// one record call for the batch's deliveries (the latest per fingerprint).
//
// Owned by the Slice; every call on the worker that owns it.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/pipeline/stats.h"
#include "kdedup/state/confirm_store.h"

namespace kdedup::state {
class SnapshotStore;
}

namespace kdedup::pipeline {

/// The confirm store `kdedup run` confirms with: `store`'s (opened with
/// StoreOptions::confirm) when config.confirm_store, else null. An error
/// when the config asks for one and `store` has none.
[[nodiscard]] Result<state::ConfirmStore*> confirm_store_for(const config::Config& config,
                                                             state::SnapshotStore* store);

class Confirmer {
 public:
  /// `counters` receives lookups, prevented false positives, lookup times
  /// and (about once a second) the store's size for the partition.
  Confirmer(std::unique_ptr<state::ConfirmPartition> store, std::uint32_t ticks_per_window,
            bool refresh, std::shared_ptr<PartitionCounters> counters);
  ~Confirmer();
  Confirmer(const Confirmer&) = delete;
  Confirmer& operator=(const Confirmer&) = delete;

  /// Confirms the filter's decisions `out` of one batch (Slice::decide has
  /// run the filter on it): fps/ticks as given to the filter, offsets the
  /// records' input offsets (empty: -1 each, deliveries learned from the
  /// output), learn as given to Slice::decide (empty: none). Duplicates the
  /// store does not confirm become distinct in `out` and are inserted into
  /// `filter` at the batch's last tick (keep_first; refresh already renewed
  /// them). Errors are the store's (RocksDB I/O): the batch must not go out.
  [[nodiscard]] Status settle(filter::SlidingFilter& filter,
                              std::span<const filter::Fingerprint> fps,
                              std::span<const filter::Tick> ticks,
                              std::span<const std::int64_t> offsets,
                              std::span<const std::uint8_t> learn, std::span<filter::Decision> out);

  [[nodiscard]] const state::ConfirmPartition& store() const noexcept { return *store_; }

  class BatchDeliveries;

 private:
  void deliver(const filter::Fingerprint& fp, filter::Tick tick, std::int64_t offset);
  Status write_deliveries(filter::Tick last);

  std::unique_ptr<state::ConfirmPartition> store_;
  std::uint32_t ticks_per_window_;
  bool refresh_;
  std::shared_ptr<PartitionCounters> counters_;
  std::unique_ptr<BatchDeliveries> batch_;
  std::int64_t last_size_ns_ = 0;  // steady clock of the last store size reading
  // Scratch, reused from batch to batch.
  std::vector<filter::Fingerprint> positives_;
  std::vector<std::optional<filter::Tick>> found_;
  std::vector<state::ConfirmWrite> writes_;
  std::vector<state::ConfirmWrite> latest_;
};

}  // namespace kdedup::pipeline
