#pragma once
// ExactFilter: salted 128-bit fingerprint -> tick of the last delivery,
// expired in time order. No false positives beyond 128-bit collisions and no
// false negatives; memory grows with the number of distinct identities in the
// window (about 48 bytes each plus hash-table overhead).
//
// It is the oracle for tests and benchmarks of the probabilistic filters and
// a real option for small windows. Same threading rules as SlidingFilter.
//
// Memory follows load by construction (capacity is not used). Under a
// MemoryBudget its table is charged once per tick, past the limit if need
// be: an exact set cannot trade accuracy for memory, so it counts against
// the budget (the other partitions' filters make room) but is never limited.

#include <deque>
#include <unordered_map>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::filter {

class ExactFilter final : public SlidingFilter {
 public:
  /// `config` must be normalized (see normalize()).
  explicit ExactFilter(const FilterConfig& config);

  FilterType type() const noexcept override { return FilterType::kExact; }
  const FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint& fp, Tick now) override;
  void insert(const Fingerprint& fp, Tick now) override;
  void advance(Tick now) override;
  FilterStats stats() const override;
  std::string serialize() const override;
  /// Charges the table's bytes now and at every tick (never refused).
  void set_memory_budget(std::shared_ptr<MemoryBudget> budget) override;

  /// Payload of an envelope of kind kExact (called by restore_filter).
  static Result<std::unique_ptr<SlidingFilter>> restore(std::string_view payload,
                                                        std::uint16_t version);

  /// True if `fp` is alive at `now` without inserting it (for auditing).
  [[nodiscard]] bool contains(const Fingerprint& fp, Tick now) const;

 private:
  struct Entry {
    Tick tick;
    Fingerprint fp;
  };
  /// stats().bytes: the map's nodes and buckets and the expiry queue.
  [[nodiscard]] std::uint64_t state_bytes() const;
  void expire(Tick now);

  FilterConfig config_;
  std::unordered_map<Fingerprint, Tick, FingerprintHash> last_;
  std::deque<Entry> order_;  // insertion order == tick order
  Tick clock_ = 0;
  std::uint64_t insertions_ = 0;
  std::shared_ptr<MemoryBudget> budget_;  // null: not accounted
  MemoryCharge charge_;                   // the table's bytes, as of the last tick
  MemoryDemand demand_;                   // the same, at every pressure level
};

}  // namespace kdedup::filter
