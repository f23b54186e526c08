#pragma once
// Internal: the deliveries of one partition recorded after its latest
// snapshot, held in memory until the next snapshot moves them into the
// confirm store's database (confirm_store.h, "Recovery"). They must not be
// on disk before then: a crash would leave deliveries the replay from the
// snapshot has not reached yet ("from its future"), and a replayed record
// would meet its own later delivery.
//
// Layout: the deliveries in input-offset order (entry seq = base + index)
// and an open-addressing index fp -> seq + 1 of each fingerprint's latest
// delivery. Moving the deliveries below a snapshot's offset out removes a
// prefix and advances `base`; index slots pointing below `base` are stale
// (skipped while probing, reused on insert, dropped at the next rebuild).
// 32 bytes per entry and 16-32 per index slot share: 50-110 bytes per
// staged delivery with the vectors' growth (docs/performance.md).
//
// Threads: the worker that owns the partition's Slice (lookup, append) and
// the snapshot writer thread (copy_below, drop_below) share it under one
// mutex, taken once per call.

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "kdedup/state/confirm_store.h"

namespace kdedup::state {

class Staging {
 public:
  /// For each fps[i] staged: ticks[i] = its latest staged tick; the others
  /// are left alone and their index appended to `misses`.
  void lookup(std::span<const filter::Fingerprint> fps,
              std::span<std::optional<filter::Tick>> ticks, std::vector<std::size_t>& misses) const;

  /// Appends deliveries (input-offset order within and across calls).
  void append(std::span<const ConfirmWrite> writes);

  /// The staged deliveries with an offset below `offset`, oldest first.
  [[nodiscard]] std::vector<ConfirmWrite> copy_below(std::int64_t offset) const;

  /// Forgets the staged deliveries with an offset below `offset` (after
  /// copy_below()'s were written to the database).
  void drop_below(std::int64_t offset);

  [[nodiscard]] std::size_t size() const;
  /// Bytes held by the entries and the index.
  [[nodiscard]] std::size_t bytes() const;

 private:
  static constexpr std::size_t kNotFound = ~std::size_t{0};

  [[nodiscard]] std::size_t find_slot(const filter::Fingerprint& fp) const;  // requires mu_
  void index(const filter::Fingerprint& fp, std::uint64_t seq);              // requires mu_
  void rebuild_index(std::size_t at_least);                                  // requires mu_
  [[nodiscard]] static std::size_t home(const filter::Fingerprint& fp, std::size_t mask) noexcept {
    return static_cast<std::size_t>(fp.lo ^ (fp.hi >> 7)) & mask;
  }

  mutable std::mutex mu_;
  std::vector<ConfirmWrite> entries_;
  std::uint64_t base_ = 0;            // seq of entries_[0]
  bool sorted_ = true;                // appended in offset order so far
  std::vector<std::uint64_t> slots_;  // seq + 1; 0 = empty
  std::size_t used_ = 0;              // slots holding a seq, live or stale
};

}  // namespace kdedup::state
