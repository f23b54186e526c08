// SnapshotStore: RocksDB database, writer thread, incremental chunk writes and
// verified reads. Layout and protocol: kdedup/state/snapshot_store.h.

#include "kdedup/state/snapshot_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/snapshot.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kdedup/common/bytes.h"
#include "snapshot_format.h"
#include "snapshot_ledger.h"
#include "state_dir.h"

namespace kdedup::state {
namespace fs = std::filesystem;
using format::ChunkId;
using format::ChunkIdHash;

namespace {

using Clock = std::chrono::steady_clock;

/// Releases a RocksDB read snapshot when the scope ends.
class ReadView {
 public:
  explicit ReadView(rocksdb::DB& db) : db_(db), snapshot_(db.GetSnapshot()) {
    options_.snapshot = snapshot_;
    options_.verify_checksums = true;
  }
  ~ReadView() { db_.ReleaseSnapshot(snapshot_); }
  ReadView(const ReadView&) = delete;
  ReadView& operator=(const ReadView&) = delete;
  const rocksdb::ReadOptions& options() const { return options_; }

 private:
  rocksdb::DB& db_;
  const rocksdb::Snapshot* snapshot_;
  rocksdb::ReadOptions options_;
};

LoadError read_failure(const rocksdb::Status& s, const PartitionKey& key, const std::string& what) {
  if (s.IsCorruption()) {
    return LoadError{LoadFailure::kCorrupt, "snapshot of " + key.to_string() + " is corrupt: " +
                                                what + ": RocksDB reports " + s.ToString()};
  }
  return LoadError{LoadFailure::kReadError, "cannot read snapshot of " + key.to_string() + " (" +
                                                what + "): " + s.ToString()};
}

}  // namespace

class SnapshotStore::Impl {
 public:
  Impl(std::string dir, StoreOptions options, bool read_only)
      : dir_(std::move(dir)), options_(options), read_only_(read_only) {}

  ~Impl() {
    if (writer_.joinable()) {
      {
        std::lock_guard lock(queue_mu_);
        stopping_ = true;
      }
      queue_cv_.notify_all();
      writer_.join();
    }
  }

  Status open() {
    rocksdb::Options o;
    compression_ = dirs::pick_compression();
    o.compression = compression_;
    o.bottommost_compression = compression_;
    o.create_if_missing = !read_only_;
    // Few, large values; keep RocksDB's own footprint and logs modest.
    o.keep_log_file_num = 4;
    o.max_log_file_size = 8 << 20;
    o.max_background_jobs = 2;
    // Point-in-time recovery: a crash can leave a torn last record in the
    // write-ahead log, and only this mode (or skipping records) opens after
    // it. It also silently drops every write after a damaged record, which
    // the ledger detects (snapshot_ledger.h). Checksums are verified on open
    // and on every read.
    o.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
    o.paranoid_checks = true;
    // The ledger before the database: a running owner writes the database
    // first, so a reader never sees a ledger ahead of the database it opens.
    auto ledger = ledger::read(dir_);
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s =
        read_only_ ? rocksdb::DB::OpenForReadOnly(o, dir_, &raw) : rocksdb::DB::Open(o, dir_, &raw);
    db_.reset(raw);  // owned from here on, even if null
    if (!s.ok()) return fail(dirs::open_error(s, dir_, read_only_));
    if (auto checked = check_ledger(ledger); !checked) return checked;
    if (!read_only_) writer_ = std::thread([this] { run_writer(); });
    return open_confirm();
  }

  /// The ConfirmStore in DIR/confirm: opened (created) with the options in
  /// read-write mode, opened read-only when present otherwise.
  Status open_confirm() {
    const std::string path = dir_ + "/confirm";
    if (read_only_) {
      std::error_code ec;
      if (!fs::exists(fs::path(path) / "CURRENT", ec)) return {};
      auto store = ConfirmStore::open_read_only(path);
      if (!store) return tl::unexpected(store.error());
      confirm_ = std::move(*store);
      return {};
    }
    if (!options_.confirm) return {};
    ConfirmOptions o = *options_.confirm;
    o.staged = true;
    o.write_ahead_log = true;
    auto store = ConfirmStore::open(path, o);
    if (!store) return tl::unexpected(store.error());
    confirm_ = std::move(*store);
    return {};
  }

  void enqueue(std::function<void()> task) {
    {
      std::lock_guard lock(queue_mu_);
      queue_.push_back(std::move(task));
    }
    queue_cv_.notify_one();
  }

  void drain() {
    std::promise<void> done;
    auto f = done.get_future();
    enqueue([&done] { done.set_value(); });
    f.wait();
  }

  Result<WriteReport> write_capture(const SnapshotCapture& c);
  Status erase(const PartitionKey& key);
  LoadResult<Snapshot> read(const PartitionKey& key,
                            std::optional<StateFingerprint> expected) const;
  Result<std::vector<ListedSnapshot>> list() const;
  std::vector<LostSnapshot> lost() const;

  const std::string dir_;
  const StoreOptions options_;
  const bool read_only_;
  rocksdb::CompressionType compression_ = rocksdb::kNoCompression;
  std::unique_ptr<ConfirmStore> confirm_;

 private:
  void run_writer() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(queue_mu_);
        queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        // Finish queued snapshots before stopping: each is a valid, wanted state.
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::string write_error(const rocksdb::Status& s, const PartitionKey& key) const {
    const std::string text = s.ToString();
    if (s.IsNoSpace() || dirs::contains(text, "No space left")) {
      return "snapshot of " + key.to_string() + " not written: disk full in state dir " + dir_ +
             "; free space or enlarge the volume and restart kdedup (RocksDB accepts no "
             "more writes after this error)";
    }
    return "snapshot of " + key.to_string() + " not written: RocksDB error in state dir " + dir_ +
           ": " + text + "; stop kdedup cleanly and check the volume";
  }

  /// Refuses a batch of `batch_bytes` unless the volume keeps the reserve
  /// after it (see StoreOptions::min_free_bytes for why).
  Status check_free_space(std::uint64_t batch_bytes, const PartitionKey& key) const {
    struct statvfs fs_stats {};
    if (::statvfs(dir_.c_str(), &fs_stats) != 0) return {};  // unknown: let RocksDB try
    const std::uint64_t free_bytes =
        static_cast<std::uint64_t>(fs_stats.f_bavail) * fs_stats.f_frsize;
    const std::uint64_t needed = 2 * batch_bytes + options_.min_free_bytes;
    if (free_bytes >= needed) return {};
    auto in_mib = [](std::uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20); };
    return fail("snapshot of " + key.to_string() + " not written: disk full in state dir " + dir_ +
                " (" + in_mib(free_bytes) + " MiB free; this snapshot needs " +
                in_mib(2 * batch_bytes) + " MiB plus a reserve of " +
                in_mib(options_.min_free_bytes) +
                " MiB); free space or enlarge the volume, then restart kdedup");
  }

  /// Compares the ledger read before the open with what RocksDB recovered,
  /// marks the partitions whose last snapshot is gone, and (read-write)
  /// writes the result back before anything else is written.
  Status check_ledger(const Result<std::optional<ledger::Entries>>& stored);
  /// After a write or erase of `key` on the writer thread: records it (entry
  /// set, or removed when `erased`) and replaces the ledger file.
  Status record(const PartitionKey& key, bool erased);
  /// The refusal of a partition whose last snapshot was lost, if it was.
  std::optional<LoadError> lost_error(const PartitionKey& key) const;

  std::unique_ptr<rocksdb::DB> db_;

  // Per partition, the sequence number of its last snapshot write and
  // whether the database lost it (snapshot_ledger.h). Changed by open() and
  // the writer thread, read by any reader.
  mutable std::mutex ledger_mu_;
  ledger::Entries ledger_;

  // Writer queue.
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread writer_;

  // The chunk ids each partition's stored snapshot references, as far as this
  // process knows them for certain (it wrote or fully verified them). A
  // partition without an entry gets a full write that first range-deletes all
  // its chunks, so a write never relies on a chunk it has not seen.
  // `generation_` counts committed writes so a read that raced with one does
  // not record a stale set.
  mutable std::mutex known_mu_;
  mutable std::unordered_map<std::string, std::unordered_set<ChunkId, ChunkIdHash>> known_;
  mutable std::uint64_t generation_ = 0;
};

Result<WriteReport> SnapshotStore::Impl::write_capture(const SnapshotCapture& c) {
  const auto start = Clock::now();
  const PartitionKey& key = c.key;
  if (key.topic.empty() || key.topic.size() > 0xffff) {
    return fail("snapshot rejected: topic name must be 1..65535 bytes");
  }
  if (key.partition < 0)
    return fail("snapshot of " + key.to_string() + " rejected: negative partition");
  if (c.state.empty()) return fail("snapshot of " + key.to_string() + " rejected: empty state");
  if (c.next_offset < 0) {
    return fail("snapshot of " + key.to_string() + " rejected: negative next offset");
  }

  const std::string_view state = c.state;
  const std::size_t chunk_size = options_.chunk_size;
  format::Manifest m;
  m.info.key = key;
  m.info.next_offset = c.next_offset;
  m.info.clock_ms = c.clock_ms;
  m.info.fingerprint = c.fingerprint;
  m.info.filter_type = c.filter_type;
  m.info.format_version = format::kVersion;
  m.info.created_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  m.info.logical_bytes = state.size();
  m.info.chunk_size = static_cast<std::uint32_t>(chunk_size);
  m.state_hash = hash64(state);
  std::unordered_set<ChunkId, ChunkIdHash> ids;
  for (std::size_t off = 0; off < state.size(); off += chunk_size) {
    m.chunks.push_back(format::chunk_id(state.substr(off, chunk_size)));
    ids.insert(m.chunks.back());
  }
  m.info.chunk_count = static_cast<std::uint32_t>(m.chunks.size());

  const std::string mkey = format::manifest_key(key);
  std::optional<std::unordered_set<ChunkId, ChunkIdHash>> previous;
  {
    std::lock_guard lock(known_mu_);
    if (auto it = known_.find(mkey); it != known_.end()) previous = it->second;
  }

  WriteReport report;
  report.key = key;
  report.logical_bytes = state.size();
  report.chunks_total = static_cast<std::uint32_t>(ids.size());
  report.full = !previous;
  report.capture_time = c.capture_time;

  rocksdb::WriteBatch batch;
  auto put = [&](const std::string& k, const std::string& v) {
    report.bytes_written += k.size() + v.size();
    return batch.Put(k, v);
  };
  rocksdb::Status s;
  if (!previous) {
    const std::string prefix = format::partition_prefix(format::kChunkTag, key);
    s = batch.DeleteRange(prefix, format::prefix_end(prefix));
  } else {
    for (const ChunkId& old : *previous) {
      if (!ids.count(old) && s.ok()) {
        s = batch.Delete(format::chunk_key(key, old));
        ++report.chunks_deleted;
      }
    }
  }
  std::unordered_set<ChunkId, ChunkIdHash> written;
  for (std::size_t i = 0; i < m.chunks.size() && s.ok(); ++i) {
    const ChunkId& id = m.chunks[i];
    if ((previous && previous->count(id)) || !written.insert(id).second) continue;
    s = put(format::chunk_key(key, id),
            format::encode_chunk(state.substr(i * chunk_size, chunk_size)));
    ++report.chunks_written;
  }
  if (s.ok()) s = put(mkey, format::encode_manifest(m));
  if (s.ok()) {
    if (auto space = check_free_space(batch.GetDataSize(), key); !space) {
      // Nothing was written; the stored snapshot (if any) is unchanged.
      return tl::unexpected(space.error());
    }
    // Confirmed mode: the deliveries this snapshot's filter knows reach the
    // confirm store, durably and bound to this manifest, before it exists.
    if (confirm_) {
      if (auto moved =
              confirm_->flush_for_snapshot(key, c.next_offset, m.info.created_ms, c.clock_ms);
          !moved) {
        return fail("snapshot of " + key.to_string() + " not written: " + moved.error().message);
      }
    }
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    s = db_->Write(wo, &batch);
  }
  {
    std::lock_guard lock(known_mu_);
    ++generation_;
    if (!s.ok()) {
      known_.erase(mkey);  // unknown outcome: next write of this partition is full
      return fail(write_error(s, key));
    }
    known_[mkey] = std::move(ids);
  }
  if (auto recorded = record(key, false); !recorded) return tl::unexpected(recorded.error());
  report.write_time = Clock::now() - start;
  return report;
}

Status SnapshotStore::Impl::erase(const PartitionKey& key) {
  const std::string prefix = format::partition_prefix(format::kChunkTag, key);
  rocksdb::WriteBatch batch;
  rocksdb::Status s = batch.DeleteRange(prefix, format::prefix_end(prefix));
  if (s.ok()) s = batch.Delete(format::manifest_key(key));
  if (s.ok()) {
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    s = db_->Write(wo, &batch);
  }
  {
    std::lock_guard lock(known_mu_);
    ++generation_;
    known_.erase(format::manifest_key(key));
    if (!s.ok()) return fail(write_error(s, key));
  }
  return record(key, true);
}

Status SnapshotStore::Impl::check_ledger(const Result<std::optional<ledger::Entries>>& stored) {
  const std::uint64_t recovered = db_->GetLatestSequenceNumber();
  // The partitions that have a manifest now.
  std::vector<PartitionKey> present;
  {
    ReadView view(*db_);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(view.options()));
    const std::string first(1, format::kManifestTag);
    const std::string last = format::prefix_end(first);
    for (it->Seek(first); it->Valid() && it->key().compare(last) < 0; it->Next()) {
      if (auto key = format::parse_manifest_key(it->key().ToStringView())) {
        present.push_back(std::move(*key));
      }
    }
    if (!it->status().ok()) {
      return fail("cannot list snapshots in state dir " + dir_ + ": " + it->status().ToString());
    }
  }
  ledger::Entries entries;
  if (!stored) {
    // Nothing can be vouched for: every stored snapshot is refused once.
    for (const auto& key : present) {
      entries[ledger::slot(key)] = {recovered, ledger::Loss::kLedgerDamaged, recovered};
    }
  } else if (*stored) {
    std::set<std::pair<std::string, std::int32_t>> present_slots;
    for (const auto& key : present) present_slots.insert(ledger::slot(key));
    for (const auto& [slot, e] : **stored) {
      if (e.loss != ledger::Loss::kNone) {
        entries[slot] = e;  // found lost before; stays so until written again
      } else if (e.sequence > recovered) {
        entries[slot] = {e.sequence, ledger::Loss::kWriteAheadLog, recovered};
      } else if (present_slots.count(slot)) {
        entries[slot] = e;
      }
      // else: erased, and the process stopped before the ledger said so.
    }
  }
  // Snapshots the ledger does not know (written before it existed, or just
  // before a crash, or it was damaged) were written at or before `recovered`.
  for (const auto& key : present) entries.try_emplace(ledger::slot(key), ledger::Entry{recovered});
  // Written back before the writer thread starts: RocksDB reuses the dropped
  // sequence numbers for new writes, so the loss must be recorded first.
  if (!read_only_) {
    if (auto written = ledger::write(dir_, entries, options_.sync); !written) {
      return fail("cannot open state dir " + dir_ + ": " + written.error().message);
    }
  }
  std::lock_guard lock(ledger_mu_);
  ledger_ = std::move(entries);
  return {};
}

Status SnapshotStore::Impl::record(const PartitionKey& key, bool erased) {
  ledger::Entries copy;
  {
    std::lock_guard lock(ledger_mu_);
    if (erased) {
      ledger_.erase(ledger::slot(key));
    } else {
      // The writer thread is the only writer: the last sequence is this write's.
      ledger_[ledger::slot(key)] = ledger::Entry{db_->GetLatestSequenceNumber()};
    }
    copy = ledger_;
  }
  // Outside the lock (readers need not wait for the fsync); only this thread
  // writes the file, so the last copy written is the newest.
  if (auto written = ledger::write(dir_, copy, options_.sync); !written) {
    return fail("snapshot of " + key.to_string() + " not recorded: " + written.error().message +
                "; stop kdedup cleanly and check the volume");
  }
  return {};
}

std::optional<LoadError> SnapshotStore::Impl::lost_error(const PartitionKey& key) const {
  std::lock_guard lock(ledger_mu_);
  auto it = ledger_.find(ledger::slot(key));
  if (it == ledger_.end() || it->second.loss == ledger::Loss::kNone) return std::nullopt;
  return LoadError{LoadFailure::kCorrupt, ledger::lost_message(key, it->second, dir_)};
}

std::vector<LostSnapshot> SnapshotStore::Impl::lost() const {
  std::vector<LostSnapshot> out;
  std::lock_guard lock(ledger_mu_);
  for (const auto& [slot, e] : ledger_) {
    if (e.loss == ledger::Loss::kNone) continue;
    PartitionKey key{slot.first, slot.second};
    out.push_back({key, ledger::lost_message(key, e, dir_)});
  }
  return out;
}

LoadResult<Snapshot> SnapshotStore::Impl::read(const PartitionKey& key,
                                               std::optional<StateFingerprint> expected) const {
  std::uint64_t generation;
  {
    std::lock_guard lock(known_mu_);
    generation = generation_;
  }
  if (auto lost = lost_error(key)) return tl::unexpected(std::move(*lost));
  ReadView view(*db_);
  const std::string mkey = format::manifest_key(key);
  std::string value;
  rocksdb::Status s = db_->Get(view.options(), mkey, &value);
  if (s.IsNotFound()) {
    return tl::unexpected(
        LoadError{LoadFailure::kMissing, "no snapshot stored for " + key.to_string()});
  }
  if (!s.ok()) return tl::unexpected(read_failure(s, key, "manifest"));
  auto manifest = format::decode_manifest(value, key);
  if (!manifest) return tl::unexpected(manifest.error());
  const SnapshotInfo& info = manifest->info;
  if (expected && !(info.fingerprint == *expected)) {
    std::vector<std::string> changed;
    if (info.fingerprint.config != expected->config) changed.push_back("filter configuration");
    if (info.fingerprint.tick_scale != expected->tick_scale) {
      changed.push_back(info.fingerprint.tick_scale == 0
                            ? "time -> tick mapping (before it was made exact)"
                            : "window or ticks_per_window");
    }
    if (info.fingerprint.salt_check != expected->salt_check) changed.push_back("salt");
    std::string what;
    for (std::size_t n = 0; n < changed.size(); ++n) {
      what += (n == 0 ? "" : n + 1 == changed.size() ? " and " : ", ") + changed[n];
    }
    return tl::unexpected(
        LoadError{LoadFailure::kConfigChanged,
                  "snapshot of " + key.to_string() + " was taken with another " + what +
                      "; it cannot be used and the partition is rebuilt from Kafka"});
  }

  Snapshot out;
  out.info = info;
  out.state.reserve(info.logical_bytes);
  std::unordered_map<ChunkId, std::string, ChunkIdHash> repeated;  // chunks seen twice
  for (std::size_t i = 0; i < manifest->chunks.size(); ++i) {
    const ChunkId& id = manifest->chunks[i];
    const std::size_t size =
        std::min<std::uint64_t>(info.chunk_size, info.logical_bytes - i * info.chunk_size);
    s = db_->Get(view.options(), format::chunk_key(key, id), &value);
    if (s.IsNotFound()) {
      return tl::unexpected(LoadError{LoadFailure::kCorrupt,
                                      "snapshot of " + key.to_string() + " is corrupt: chunk " +
                                          std::to_string(i) + " (" + format::to_hex(id) +
                                          ") listed in the manifest is missing"});
    }
    if (!s.ok()) return tl::unexpected(read_failure(s, key, "chunk " + std::to_string(i)));
    auto bytes = format::decode_chunk(value, i, id, size);
    if (!bytes) {
      return tl::unexpected(
          LoadError{bytes.error().reason,
                    "snapshot of " + key.to_string() + " is corrupt: " + bytes.error().message});
    }
    out.state.append(*bytes);
  }
  if (hash64(out.state) != manifest->state_hash) {
    return tl::unexpected(
        LoadError{LoadFailure::kCorrupt, "snapshot of " + key.to_string() +
                                             " is corrupt: reassembled state does not match the "
                                             "manifest's hash"});
  }
  // Every chunk the manifest lists is verified present: later writes of this
  // partition may be incremental against it, unless a write happened meanwhile.
  if (!read_only_) {
    std::lock_guard lock(known_mu_);
    if (generation == generation_ && !known_.count(mkey)) {
      known_[mkey] = {manifest->chunks.begin(), manifest->chunks.end()};
    }
  }
  return out;
}

Result<std::vector<ListedSnapshot>> SnapshotStore::Impl::list() const {
  ReadView view(*db_);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(view.options()));
  std::vector<ListedSnapshot> out;
  const std::string first(1, format::kManifestTag);
  const std::string last = format::prefix_end(first);
  for (it->Seek(first); it->Valid() && it->key().compare(last) < 0; it->Next()) {
    auto key = format::parse_manifest_key(it->key().ToStringView());
    if (!key) continue;  // not ours (cannot happen in a kdedup dir); skip rather than fail
    ListedSnapshot entry{*key, tl::unexpected(LoadError{})};
    auto manifest = format::decode_manifest(it->value().ToStringView(), *key);
    if (!manifest) {
      entry.info = tl::unexpected(manifest.error());
    } else {
      SnapshotInfo info = manifest->info;
      const std::string begin = format::partition_prefix(format::kChunkTag, *key);
      const std::string end = format::prefix_end(begin);
      rocksdb::Range range(begin, end);
      rocksdb::SizeApproximationOptions approx;
      approx.include_memtables = true;
      approx.include_files = true;
      std::uint64_t size = 0;
      if (db_->GetApproximateSizes(approx, db_->DefaultColumnFamily(), &range, 1, &size).ok()) {
        info.disk_bytes = size;
      }
      entry.info = std::move(info);
    }
    out.push_back(std::move(entry));
  }
  if (!it->status().ok()) {
    return fail("cannot list snapshots in state dir " + dir_ + ": " + it->status().ToString());
  }
  // A partition whose last snapshot was lost shows as corrupt, whether an
  // older manifest is left or none at all.
  for (auto& entry : out) {
    if (auto lost = lost_error(entry.key)) entry.info = tl::unexpected(std::move(*lost));
  }
  for (const auto& gone : lost()) {
    const bool listed = std::any_of(out.begin(), out.end(),
                                    [&](const ListedSnapshot& e) { return e.key == gone.key; });
    if (!listed) {
      out.push_back({gone.key, tl::unexpected(LoadError{LoadFailure::kCorrupt, gone.message})});
    }
  }
  std::sort(out.begin(), out.end(), [](const ListedSnapshot& a, const ListedSnapshot& b) {
    return a.key.topic != b.key.topic ? a.key.topic < b.key.topic
                                      : a.key.partition < b.key.partition;
  });
  return out;
}

// ---- public surface ----

SnapshotStore::SnapshotStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SnapshotStore::~SnapshotStore() = default;

Result<std::unique_ptr<SnapshotStore>> SnapshotStore::open(const std::string& dir,
                                                           StoreOptions options) {
  if (options.chunk_size < 4096 || options.chunk_size > (64u << 20)) {
    return fail("snapshot chunk size must be 4 KiB .. 64 MiB, got " +
                std::to_string(options.chunk_size));
  }
  if (auto ok = dirs::prepare(dir, false); !ok) return tl::unexpected(ok.error());
  auto impl = std::make_unique<Impl>(dir, options, false);
  if (auto ok = impl->open(); !ok) return tl::unexpected(ok.error());
  return std::unique_ptr<SnapshotStore>(new SnapshotStore(std::move(impl)));
}

Result<std::unique_ptr<SnapshotStore>> SnapshotStore::open_read_only(const std::string& dir) {
  if (auto ok = dirs::prepare(dir, true); !ok) return tl::unexpected(ok.error());
  auto impl = std::make_unique<Impl>(dir, StoreOptions{}, true);
  if (auto ok = impl->open(); !ok) return tl::unexpected(ok.error());
  return std::unique_ptr<SnapshotStore>(new SnapshotStore(std::move(impl)));
}

void SnapshotStore::submit(SnapshotCapture capture, Callback done) {
  if (impl_->read_only_) {
    done(fail("snapshot of " + capture.key.to_string() + " not written: state dir " + impl_->dir_ +
              " was opened read-only"));
    return;
  }
  auto shared = std::make_shared<SnapshotCapture>(std::move(capture));
  impl_->enqueue([impl = impl_.get(), shared, done = std::move(done)]() mutable {
    auto report = impl->write_capture(*shared);
    shared.reset();  // free the state copy before running the callback
    done(std::move(report));
  });
}

std::future<Result<WriteReport>> SnapshotStore::submit(SnapshotCapture capture) {
  auto promise = std::make_shared<std::promise<Result<WriteReport>>>();
  auto future = promise->get_future();
  submit(std::move(capture),
         [promise](Result<WriteReport> report) { promise->set_value(std::move(report)); });
  return future;
}

Result<WriteReport> SnapshotStore::write(SnapshotCapture capture) {
  return submit(std::move(capture)).get();
}

LoadResult<Snapshot> SnapshotStore::read(const PartitionKey& key,
                                         std::optional<StateFingerprint> expected) const {
  return impl_->read(key, expected);
}

LoadResult<RestoredSnapshot> SnapshotStore::load(const PartitionKey& key,
                                                 const StateFingerprint& expected) const {
  if (impl_->confirm_ && !impl_->read_only_) impl_->drain();
  auto snapshot = impl_->read(key, expected);
  if (!snapshot) return tl::unexpected(snapshot.error());
  if (impl_->confirm_) {
    if (auto why = impl_->confirm_->refusal(snapshot->info)) {
      return tl::unexpected(LoadError{LoadFailure::kConfirmStore, *why});
    }
  }
  auto filter = filter::restore_filter(snapshot->state);
  auto corrupt = [&](const std::string& what) {
    return tl::unexpected(LoadError{LoadFailure::kCorrupt,
                                    "snapshot of " + key.to_string() + " is corrupt: " + what});
  };
  if (!filter) return corrupt(filter.error().message);
  if (filter::config_fingerprint((*filter)->config()) != snapshot->info.fingerprint.config ||
      (*filter)->type() != snapshot->info.filter_type) {
    return corrupt("the restored filter's configuration differs from the manifest's");
  }
  return RestoredSnapshot{std::move(snapshot->info), std::move(*filter)};
}

Status SnapshotStore::erase(const PartitionKey& key) {
  if (impl_->read_only_) return fail("state dir " + impl_->dir_ + " was opened read-only");
  auto promise = std::make_shared<std::promise<Status>>();
  auto future = promise->get_future();
  impl_->enqueue([impl = impl_.get(), key, promise] { promise->set_value(impl->erase(key)); });
  return future.get();
}

Result<std::vector<ListedSnapshot>> SnapshotStore::list() const { return impl_->list(); }

std::vector<LostSnapshot> SnapshotStore::lost() const { return impl_->lost(); }

void SnapshotStore::drain() {
  if (!impl_->read_only_) impl_->drain();
}

const std::string& SnapshotStore::dir() const noexcept { return impl_->dir_; }
bool SnapshotStore::read_only() const noexcept { return impl_->read_only_; }
ConfirmStore* SnapshotStore::confirm() const noexcept { return impl_->confirm_.get(); }

const char* SnapshotStore::compression() const noexcept {
  return dirs::compression_name(impl_->compression_);
}

}  // namespace kdedup::state
