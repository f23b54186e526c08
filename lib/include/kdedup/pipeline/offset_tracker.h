#pragma once
// OffsetTracker: which input offset of one partition may be committed.
//
// At-least-once rule: an input offset may be committed only when every output
// produced for it, and for every record before it, has been delivered. The
// worker that owns the partition's Slice registers each processed record (in
// offset order) with the number of outputs it produced (0, or 1 for the
// output / duplicates / dead-letter topic); the producer's delivery reports
// acknowledge them, in any order. committable() is the Kafka commit position:
// the offset of the first record not yet fully delivered, or one past the
// last registered record when everything is delivered.
//
// A failed delivery pins the position at that record for good (the service
// stops; the record is neither skipped nor committed past).
//
// Ownership: shared (std::shared_ptr) by the partition's Slice (worker
// thread), the consumer thread (commits) and in-flight delivery reports
// (delivery thread). All methods are thread-safe; the lock is taken once per
// batch by the worker and once per delivery report.

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>

namespace kdedup::pipeline {

class OffsetTracker {
 public:
  /// One processed record: its offset and how many outputs await delivery.
  struct Processed {
    std::int64_t offset = 0;
    std::uint32_t outputs = 0;
  };

  OffsetTracker() = default;
  OffsetTracker(const OffsetTracker&) = delete;
  OffsetTracker& operator=(const OffsetTracker&) = delete;

  /// Registers processed records. Offsets must be strictly increasing across
  /// calls (gaps are fine: compaction and transaction markers leave them).
  /// Returns false, and registers nothing, if an offset goes backwards.
  [[nodiscard]] bool add(std::span<const Processed> records);
  [[nodiscard]] bool add(std::int64_t offset, std::uint32_t outputs) {
    Processed p{offset, outputs};
    return add(std::span<const Processed>(&p, 1));
  }

  /// A delivery report for one output of `offset` succeeded.
  void delivered(std::int64_t offset);

  /// A delivery report for one output of `offset` failed permanently: the
  /// commit position never passes `offset` again. The first reason is kept.
  void failed(std::int64_t offset, std::string reason);

  /// The offset to commit (Kafka convention: the next record to read), or
  /// nullopt when no record has completed yet.
  [[nodiscard]] std::optional<std::int64_t> committable() const;

  /// Outputs produced but not yet acknowledged.
  [[nodiscard]] std::uint64_t in_flight() const;

  /// Records registered but not yet fully delivered (commit lag in records).
  [[nodiscard]] std::size_t pending_records() const;

  /// The first permanent delivery failure, if any.
  [[nodiscard]] std::optional<std::string> failure() const;

 private:
  struct Entry {
    std::int64_t offset;
    std::uint32_t pending;
    bool failed;
  };
  Entry* find(std::int64_t offset);  // requires mu_
  void pop_completed();              // requires mu_

  mutable std::mutex mu_;
  std::deque<Entry> entries_;  // offsets strictly increasing; front is not complete
  std::optional<std::int64_t> committable_;
  std::int64_t last_offset_ = -1;
  std::uint64_t in_flight_ = 0;
  std::optional<std::string> failure_;
  bool frozen_ = false;  // a failure for an unregistered offset: never advance
};

}  // namespace kdedup::pipeline
