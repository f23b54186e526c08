#pragma once
// SnapshotStore: the per-process RocksDB database under `state.dir` that keeps
// one snapshot per input partition, written incrementally and off the worker
// threads.
//
// Storage layout (one RocksDB database, default column family):
//   manifest  'm' | topic | partition  -> envelope(kind manifest): the
//             SnapshotInfo fields, the XXH3-64 of the whole state and the
//             ordered list of chunk ids
//   chunk     'c' | topic | partition | id -> envelope(kind chunk): raw bytes
// In confirmed mode the ConfirmStore's database lives in DIR/confirm and
// travels with the snapshots (StoreOptions::confirm).
// Beside the database, the file `kdedup-ledger` records each partition's
// last snapshot write (its RocksDB sequence number), so a write RocksDB's
// recovery dropped is detected (lost()).
// The state blob is cut into fixed-size chunks; a chunk's id is the XXH3-128
// of its bytes, so an unchanged chunk keeps its key and is not rewritten.
// A snapshot is one WriteBatch: new chunks, deletes of chunks no longer
// referenced, and the manifest. RocksDB applies a batch entirely or not at
// all (also across a crash: the WAL drops a torn batch), so a reader sees the
// previous snapshot or the new one, never a mix. Reads go through a RocksDB
// snapshot for the same reason.
//
// Checks on load: that the ledger does not say the partition's last write
// was lost, the manifest envelope checksum, its format version, that
// it names the partition it is stored under, the config/salt fingerprint,
// each chunk's envelope checksum, that each chunk hashes to its id and has
// the expected size, the hash of the reassembled state, and (load()) that the
// filter restores and carries the manifest's config. Anything else is a
// LoadError, never a silently different filter.
//
// How the pipeline must call it to keep DESIGN.md's recovery invariants:
//  1. Open once per process at start-up (open()); a second open of the same
//     dir fails with "another kdedup instance is using ...": two owners of the
//     same state would write over each other.
//  2. On assignment of a partition: load(key, expected). On success, continue
//     from info.next_offset with clock info.clock_ms, BUT only if
//     info.next_offset <= the group's committed offset C (it always is when
//     rule 3 is followed; if it is not — the commit was lost — treat it as
//     kMissing). Then replay [next_offset, C) in rebuild mode. On any
//     LoadError: log and count `to_string(reason)`, start an empty filter from
//     C minus one window and replay to C in rebuild mode.
//  3. Snapshot S never ahead of the committed offset: on the worker, call
//     capture_snapshot() at a record boundary (next_offset = offset after the
//     last record the filter saw); submit() the capture only after a commit of
//     an offset >= capture.next_offset has SUCCEEDED. In transactional mode
//     that means after the transaction that contained those offsets committed.
//     Capturing at a commit point (capture right after the commit succeeds,
//     with next_offset = the committed offset) is the simplest way.
//  4. Keep at most one submit in flight per partition (wait for its callback);
//     captures hold a full copy of the state, so a slow disk must not queue
//     many of them.
//  5. On revocation: finish in-flight records, commit, capture, submit, and
//     wait for the callback before giving the partition up (or erase() the
//     snapshot if the partition should start clean elsewhere).
//  6. A write error (disk full, I/O error) is reported to the callback; RocksDB
//     stops accepting writes after an I/O error, and "disk full" is reported
//     before RocksDB itself runs out of space (see min_free_bytes); either
//     way the caller should stop the process
//     cleanly (stop consuming, commit what was delivered, exit non-zero) —
//     the committed offsets stay correct, and the next start rebuilds.
//
// Threading: every public method is thread-safe. Writes (submit/write/erase)
// are executed in order by the store's one writer thread; callbacks run on
// that thread and must be short and must not call write() or erase() (they
// would wait for the thread they are running on). read/load/list run on the
// calling thread. The destructor finishes queued writes, then closes.

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/state/confirm_store.h"
#include "kdedup/state/snapshot.h"

namespace kdedup::state {

struct StoreOptions {
  /// Chunk size for new snapshots; smaller finds more unchanged chunks,
  /// larger means fewer keys. 4 KiB .. 64 MiB.
  std::uint32_t chunk_size = 256 * 1024;
  /// fsync the WAL with every snapshot. Not needed for the invariants (a lost
  /// snapshot only means an older one is used, which is never ahead of C) but
  /// it bounds how much replay a power loss costs.
  bool sync = true;
  /// Free space to keep on the volume. A snapshot is refused with a "disk
  /// full" error unless the volume has twice its batch size (WAL + flushed
  /// table) plus this reserve free: RocksDB 7.8 as packaged by Debian aborts
  /// the process on ENOSPC in the WAL (an internal assertion, fixed upstream
  /// in 9.x), so kdedup must stop before RocksDB runs out of space.
  std::uint64_t min_free_bytes = 64ULL << 20;
  /// Confirmed mode (filter.confirm_store): open the ConfirmStore in
  /// DIR/confirm with these options, staged. It then follows this store's
  /// protocol: before each manifest is written its partition's staged
  /// deliveries below the snapshot move to disk and are bound to it, and
  /// load() refuses (kConfirmStore) a snapshot the ConfirmStore cannot back.
  std::optional<ConfirmOptions> confirm;
};

/// One listed manifest: its info, or why it cannot be read.
struct ListedSnapshot {
  PartitionKey key;
  LoadResult<SnapshotInfo> info;
};

/// A partition whose last snapshot the state dir no longer holds.
struct LostSnapshot {
  PartitionKey key;
  std::string message;  ///< complete sentence: what was lost and why
};

class SnapshotStore {
 public:
  using Callback = std::function<void(Result<WriteReport>)>;

  /// Opens (or creates) the database in `dir` for reading and writing and
  /// starts the writer thread. `dir` is created if missing when its parent
  /// exists. Errors name the directory and what to do: missing parent, not a
  /// directory, not writable, another instance holds the lock, corrupted.
  [[nodiscard]] static Result<std::unique_ptr<SnapshotStore>> open(const std::string& dir,
                                                                   StoreOptions options = {});

  /// Opens an existing database for reading only (no lock taken, nothing
  /// written): works while a running instance owns the directory and needs
  /// only read permission. Shows the state as of this call. submit/erase fail.
  [[nodiscard]] static Result<std::unique_ptr<SnapshotStore>> open_read_only(
      const std::string& dir);

  ~SnapshotStore();
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  /// Step 2: queues `capture` for the writer thread; `done` is called there
  /// with what the write cost or why it failed. See the protocol above for
  /// when a capture may be submitted.
  void submit(SnapshotCapture capture, Callback done);
  /// Same, with a future instead of a callback.
  [[nodiscard]] std::future<Result<WriteReport>> submit(SnapshotCapture capture);
  /// Same, waiting for the write. Not from a callback.
  [[nodiscard]] Result<WriteReport> write(SnapshotCapture capture);

  /// Reads and verifies the snapshot of `key`. With `expected`, a snapshot
  /// of another config or salt is refused (kConfigChanged); without, any
  /// fingerprint is accepted (inspection).
  [[nodiscard]] LoadResult<Snapshot> read(const PartitionKey& key,
                                          std::optional<StateFingerprint> expected) const;

  /// read() plus restore_filter(): the filter to continue with. With a
  /// ConfirmStore, first waits for the snapshot writes queued before it (so
  /// no write of an earlier owner of the partition lands after the new
  /// Slice attached), and refuses a snapshot the ConfirmStore cannot back
  /// (kConfirmStore).
  [[nodiscard]] LoadResult<RestoredSnapshot> load(const PartitionKey& key,
                                                  const StateFingerprint& expected) const;

  /// Deletes the snapshot of `key` (manifest and chunks, one batch), ordered
  /// after every write submitted before it. Missing is not an error.
  [[nodiscard]] Status erase(const PartitionKey& key);

  /// Every stored manifest, sorted by topic and partition, with approximate
  /// on-disk size; chunks are not read (use read() to verify them). A
  /// partition whose last snapshot was lost (see lost()) is listed as
  /// kCorrupt, also when no manifest of it is left.
  [[nodiscard]] Result<std::vector<ListedSnapshot>> list() const;

  /// Partitions whose last snapshot write the database lost, found at open:
  /// RocksDB recovered a damaged write-ahead log only up to an earlier write
  /// (it drops the rest silently), or the ledger that records each
  /// partition's last write was itself damaged. read() and load() refuse
  /// them as kCorrupt until the partition is written again or erased; the
  /// finding is kept in the state dir, so it survives restarts.
  [[nodiscard]] std::vector<LostSnapshot> lost() const;

  /// Blocks until every write submitted before this call has finished.
  void drain();

  [[nodiscard]] const std::string& dir() const noexcept;
  [[nodiscard]] bool read_only() const noexcept;
  /// Compression RocksDB uses for this database ("ZSTD", "LZ4", "none").
  [[nodiscard]] const char* compression() const noexcept;
  /// The ConfirmStore opened with StoreOptions::confirm (read-only stores:
  /// DIR/confirm when it exists), or null.
  [[nodiscard]] ConfirmStore* confirm() const noexcept;

  class Impl;

 private:
  explicit SnapshotStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdedup::state
