#pragma once
// ConfirmStore: the exact secondary store of confirmed mode (seed 003 §5,
// "a secondary store ... stores the actual hashes of items that passed the
// filter"; DESIGN.md "Confirmed mode"). The in-memory filter answers "new"
// for almost every distinct record without touching disk; only its
// "duplicate" answers are looked up here, and a fingerprint that is absent
// or older than the window turns the answer into "distinct" (a prevented
// false positive).
//
// Storage (one RocksDB database, default column family):
//   entry  'e' | u32 partition id (BE) | fp.hi (BE) | fp.lo (BE) -> u64 tick (LE)
//          the salted 128-bit fingerprint of a delivered identity and the
//          tick of its last delivery (or occurrence, on_duplicate: refresh);
//   meta   'm' | u16 topic length | topic | u32 partition -> envelope: the
//          partition's id, time -> tick mapping, and which snapshot the
//          entries belong to (the binding, see below);
//   'n'    -> the next partition id.
// A partition id keeps the entry keys short (21 bytes) and lets a range
// delete drop one partition's entries at once.
//
// Expiry (seed 003 §5: "items should have a TTL ... after which they are
// forgotten"): a compaction filter drops an entry once it is more than one
// window older than the partition's expiry horizon, so expired entries go
// away as RocksDB compacts, without a scan per tick (docs/performance.md
// "Confirmed mode" measures this against time-bucketed keys with range
// deletes). Lookups judge the window themselves, so an entry not yet
// compacted away is only dead weight.
//
// Recovery (DESIGN.md "Recovery protocol", the same invariants as the
// filter's snapshots). In `staged` mode (kdedup run) the database holds
// exactly the deliveries below the partition's latest snapshot S:
//   - deliveries after S are staged in memory (ConfirmPartition), looked up
//     there first;
//   - writing snapshot N (SnapshotStore's writer thread, after a commit
//     covered N) first moves the staged deliveries below N into the
//     database, syncs its write-ahead log and records the binding (N, the
//     manifest's creation time); only then is the manifest written;
//   - a snapshot is restorable only while the binding names it
//     (refusal()): then the database holds every delivery the snapshot's
//     filter knows and none after it, so the replay from S sees no
//     delivery "from its future" (a record after the committed offset
//     judged a duplicate of itself would be silent loss) and every
//     delivery from its past;
//   - a Slice that does not restore a snapshot starts the partition empty
//     (attach() without `restored`: every entry range-deleted), and the
//     rebuild from Kafka stages what it learns (ReplayRule kLearn);
//   - a crash loses only staged deliveries, which the replay from S
//     re-derives.
// In direct mode (kdedup filter: nothing to recover) deliveries are written
// in one WriteBatch per record batch and the expiry horizon follows the
// partition clock.
//
// Threads: ConfirmStore's methods are thread-safe. attach() runs where
// Slices are built (the consumer thread), lookup()/record() of a
// ConfirmPartition on the worker that owns the Slice, flush_for_snapshot()
// on the SnapshotStore's writer thread; a partition's staging is shared by
// the last two under one short lock. RocksDB's own compaction threads run
// the expiry filter.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/tick_scale.h"
#include "kdedup/state/snapshot.h"

namespace rocksdb {
class TableFactory;
}  // namespace rocksdb

namespace kdedup::state {

/// The confirm store's table layout: two-level index and partitioned bloom
/// filters whose blocks live in one LRU block cache of `block_cache_bytes`
/// (so the cache bounds the read memory whatever the number of entries),
/// 8 KiB blocks. The benchmarks' RocksDB baselines use it too.
[[nodiscard]] std::shared_ptr<rocksdb::TableFactory> confirm_table_factory(
    std::size_t block_cache_bytes);

/// RocksDB settings of a ConfirmStore. The caches bound what the store
/// holds in memory whatever its size on disk (docs/operations.md "Confirmed
/// mode": RAM = the filter + these + the staged deliveries).
struct ConfirmOptions {
  /// kdedup run: deliveries after the latest snapshot are staged in memory
  /// and move to disk with the next snapshot (see the file comment).
  /// false: written straight away, one WriteBatch per record batch.
  bool staged = true;
  /// Keep RocksDB's write-ahead log (never synced per write; synced once
  /// per snapshot). Off for `kdedup filter`, which starts empty every run.
  bool write_ahead_log = true;
  /// LRU cache for data, index and bloom filter blocks.
  std::uint64_t block_cache_bytes = 32ULL << 20;
  /// One memtable; at most `write_buffers` of them exist at once.
  std::uint64_t write_buffer_bytes = 16ULL << 20;
  int write_buffers = 2;
  /// Files not rewritten for this long are compacted anyway, so the expiry
  /// filter also reaches partitions that stopped receiving records.
  std::chrono::seconds periodic_compaction{24 * 3600};
};

/// One delivery to record: the fingerprint, its tick and the input offset
/// of the record (-1 for deliveries learned from the output whose input
/// record is gone: they precede every offset).
struct ConfirmWrite {
  filter::Fingerprint fp;
  filter::Tick tick = 0;
  std::int64_t offset = -1;
};

/// What `kdedup snapshot inspect` shows of one partition.
struct ConfirmPartitionInfo {
  PartitionKey key;
  std::uint32_t id = 0;
  std::int64_t window_ms = 0;
  std::uint32_t ticks_per_window = 0;
  /// The snapshot the entries belong to (next offset, manifest creation
  /// time); none: no snapshot can be restored with this store.
  std::optional<std::int64_t> snapshot_offset;
  std::int64_t snapshot_created_ms = 0;
  filter::Tick horizon = 0;  ///< expiry horizon: entries older by a window are dropped
  std::uint64_t approximate_bytes = 0;
  std::uint64_t approximate_entries = 0;
  /// With counting (inspect --verify): entries read, and those alive at the
  /// horizon.
  std::optional<std::uint64_t> entries;
  std::optional<std::uint64_t> live_entries;
};

class ConfirmStore;

/// One Slice's view of its partition in the store. Created by attach(),
/// owned by the Slice; lookup() and record() are called by the worker that
/// owns the Slice (never concurrently with each other).
class ConfirmPartition {
 public:
  ~ConfirmPartition();
  ConfirmPartition(const ConfirmPartition&) = delete;
  ConfirmPartition& operator=(const ConfirmPartition&) = delete;

  /// The tick of the latest recorded delivery of each fps[i] (staged or
  /// stored), or none. One RocksDB MultiGet for those not staged. Errors are
  /// RocksDB read errors, worded for a log line.
  [[nodiscard]] Status lookup(std::span<const filter::Fingerprint> fps,
                              std::span<std::optional<filter::Tick>> ticks);

  /// Records deliveries, in input-offset order: staged, or (direct mode)
  /// written in one WriteBatch without fsync.
  [[nodiscard]] Status record(std::span<const ConfirmWrite> writes);

  /// The partition clock moved to `now` (direct mode: the expiry horizon).
  void advance(filter::Tick now) noexcept;

  /// Approximate bytes of the partition's entries in the database
  /// (memtables included). A few index lookups: call it now and then.
  [[nodiscard]] std::uint64_t approximate_bytes() const;
  /// Deliveries staged in memory, waiting for the next snapshot.
  [[nodiscard]] std::uint64_t staged() const;
  /// Memory the staging holds (its entries and index).
  [[nodiscard]] std::uint64_t staged_bytes() const;

  struct Shared;

 private:
  friend class ConfirmStore;
  explicit ConfirmPartition(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
  // Scratch for lookup(), reused from batch to batch.
  std::vector<std::string> keys_;
  std::vector<std::size_t> misses_;
};

class ConfirmStore {
 public:
  /// Opens (or creates) the database in `dir`, creating the directory when
  /// its parent exists. Errors name the directory and what to do.
  [[nodiscard]] static Result<std::unique_ptr<ConfirmStore>> open(const std::string& dir,
                                                                  ConfirmOptions options = {});
  /// Opens an existing database for reading only (inspection next to a
  /// running instance); attach() and the snapshot calls fail.
  [[nodiscard]] static Result<std::unique_ptr<ConfirmStore>> open_read_only(const std::string& dir);

  ~ConfirmStore();
  ConfirmStore(const ConfirmStore&) = delete;
  ConfirmStore& operator=(const ConfirmStore&) = delete;

  /// Where restoring a snapshot starts: its next offset.
  struct Restored {
    std::int64_t next_offset = 0;
  };

  /// A Slice of `key` starts. `restored`: it continues from the snapshot
  /// the binding names (refusal() said yes); the entries below it are kept
  /// and the staging starts empty. None: the partition starts empty (every
  /// entry range-deleted, the binding cleared). `scale` is the Slice's time
  /// -> tick mapping, which the entries' ticks follow. Replaces the
  /// staging of an earlier Slice of the partition (its deliveries were not
  /// covered by a written snapshot).
  [[nodiscard]] Result<std::unique_ptr<ConfirmPartition>> attach(const PartitionKey& key,
                                                                 const filter::TickScale& scale,
                                                                 std::optional<Restored> restored);

  /// Why the snapshot described by `info` cannot be restored with this
  /// store (a complete sentence), or none when it can: the binding names
  /// exactly this snapshot and the same time -> tick mapping.
  [[nodiscard]] std::optional<std::string> refusal(const SnapshotInfo& info) const;

  /// Snapshot protocol, before the manifest of `key` at `next_offset` is
  /// written: moves the staged deliveries below it into the database,
  /// syncs the write-ahead log and binds the entries to the manifest
  /// (`created_ms`), whose clock `clock_ms` becomes the expiry horizon.
  /// A partition with nothing staged (no Slice attached in this process)
  /// clears its binding instead: the store cannot vouch for that snapshot.
  [[nodiscard]] Status flush_for_snapshot(const PartitionKey& key, std::int64_t next_offset,
                                          std::int64_t created_ms, std::int64_t clock_ms);

  /// Every partition with entries or a binding; `count` reads every entry
  /// (exact counts, slow on a large store).
  [[nodiscard]] Result<std::vector<ConfirmPartitionInfo>> list(bool count = false) const;

  /// Approximate size of the whole database on disk plus its memtables.
  [[nodiscard]] std::uint64_t approximate_bytes() const;

  /// Memory RocksDB holds for the store now: block cache contents (data,
  /// index and bloom filter blocks), memtables and table readers. Bounded by
  /// the options' caches whatever the number of entries.
  [[nodiscard]] std::uint64_t memory_bytes() const;

  /// Compacts the whole database now, so every expired entry is dropped
  /// (tests, benchmarks; RocksDB does it in the background as files fill).
  [[nodiscard]] Status compact();

  /// Entries the expiry filter dropped in compactions of this process.
  [[nodiscard]] std::uint64_t expired() const noexcept;

  [[nodiscard]] const std::string& dir() const noexcept;
  [[nodiscard]] const ConfirmOptions& options() const noexcept;

  class Impl;

 private:
  explicit ConfirmStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdedup::state
