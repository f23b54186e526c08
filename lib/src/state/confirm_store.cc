// ConfirmStore: the exact secondary store of confirmed mode. Layout, expiry
// and the recovery protocol: kdedup/state/confirm_store.h.

#include "kdedup/state/confirm_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "confirm_expiry.h"
#include "confirm_format.h"
#include "confirm_staging.h"
#include "state_dir.h"

namespace kdedup::state {

std::shared_ptr<rocksdb::TableFactory> confirm_table_factory(std::size_t block_cache_bytes) {
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = rocksdb::NewLRUCache(block_cache_bytes);
  // Index and filter blocks live in the block cache too, so its size bounds
  // the store's read memory whatever the number of entries.
  t.cache_index_and_filter_blocks = true;
  t.cache_index_and_filter_blocks_with_high_priority = true;
  t.pin_l0_filter_and_index_blocks_in_cache = true;
  t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  t.partition_filters = true;
  t.pin_top_level_index_and_filter = true;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.block_size = 8 * 1024;
  t.format_version = 5;
  return std::shared_ptr<rocksdb::TableFactory>(rocksdb::NewBlockBasedTableFactory(t));
}

namespace {

constexpr const char* kWhat = "confirm store";
/// Staged deliveries go to disk in WriteBatches of this many entries.
constexpr std::size_t kFlushChunk = 64 * 1024;

std::string read_error(const rocksdb::Status& s, const std::string& dir) {
  return "cannot read the confirm store in " + dir + ": RocksDB reports " + s.ToString() +
         (s.IsCorruption() ? "; move the directory aside and restart: kdedup rebuilds it from Kafka"
                           : "; check the volume");
}

/// Orders deliveries by their entry key (fp.hi, fp.lo), later deliveries of
/// one fingerprint after earlier ones (the later Put wins). A WriteBatch in
/// key order lets the memtable's skip list start each insert from where the
/// previous one ended; the sort costs little next to the inserts (its gain
/// alone was not measured apart from the staging's).
void sort_by_key(std::vector<ConfirmWrite>& writes) {
  std::stable_sort(writes.begin(), writes.end(), [](const ConfirmWrite& a, const ConfirmWrite& b) {
    return a.fp.hi != b.fp.hi ? a.fp.hi < b.fp.hi : a.fp.lo < b.fp.lo;
  });
}

std::string write_error(const rocksdb::Status& s, const std::string& dir) {
  const std::string text = s.ToString();
  if (s.IsNoSpace() || dirs::contains(text, "No space left")) {
    return "cannot write the confirm store in " + dir +
           ": disk full; free space or enlarge the volume and restart kdedup (RocksDB accepts no "
           "more writes after this error)";
  }
  return "cannot write the confirm store in " + dir + ": RocksDB reports " + text +
         "; stop kdedup cleanly and check the volume";
}

}  // namespace

class ConfirmStore::Impl {
 public:
  Impl(std::string dir, ConfirmOptions options, bool read_only)
      : dir_(std::move(dir)), options_(options), read_only_(read_only) {}

  Status open();
  Result<std::unique_ptr<ConfirmPartition>> attach(const PartitionKey& key,
                                                   const filter::TickScale& scale,
                                                   std::optional<Restored> restored);
  std::optional<std::string> refusal(const SnapshotInfo& info) const;
  Status flush_for_snapshot(const PartitionKey& key, std::int64_t next_offset,
                            std::int64_t created_ms, std::int64_t clock_ms);
  Result<std::vector<ConfirmPartitionInfo>> list(bool count) const;
  std::uint64_t range_bytes(std::uint32_t id) const;
  std::uint64_t total_bytes() const;
  Status compact() {
    rocksdb::CompactRangeOptions o;
    o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    if (auto s = db_->CompactRange(o, nullptr, nullptr); !s.ok()) {
      return fail(write_error(s, dir_));
    }
    return {};
  }

  [[nodiscard]] rocksdb::WriteOptions write_options() const {
    rocksdb::WriteOptions wo;
    wo.disableWAL = !options_.write_ahead_log;
    return wo;
  }
  Status put_meta(rocksdb::WriteBatch& batch, const PartitionKey& key, const confirm::Meta& m) {
    if (auto s = batch.Put(confirm::meta_key(key), confirm::encode_meta(m)); !s.ok()) {
      return fail(write_error(s, dir_));
    }
    return {};
  }
  Status write(rocksdb::WriteBatch& batch) {
    if (auto s = db_->Write(write_options(), &batch); !s.ok()) return fail(write_error(s, dir_));
    return {};
  }

  const std::string dir_;
  const ConfirmOptions options_;
  const bool read_only_;
  std::unique_ptr<rocksdb::DB> db_;
  std::shared_ptr<confirm::ExpiryRegistry> expiry_ = std::make_shared<confirm::ExpiryRegistry>();
  std::shared_ptr<confirm::ExpiryFilterFactory> expiry_filter_ =
      std::make_shared<confirm::ExpiryFilterFactory>(expiry_);

 private:
  Status load_metas();

  // Partition records and stagings, by meta key. Changed by attach() and
  // flush_for_snapshot(), read by refusal() and list().
  mutable std::mutex mu_;
  std::map<std::string, confirm::Meta> metas_;
  std::map<std::string, std::shared_ptr<Staging>> staging_;
  std::uint32_t next_id_ = 1;
};

/// What a ConfirmPartition and the store share about one attached Slice.
struct ConfirmPartition::Shared {
  ConfirmStore::Impl* store = nullptr;
  std::uint32_t id = 0;
  std::shared_ptr<Staging> staging;  ///< null in direct mode
  std::shared_ptr<confirm::PartitionExpiry> expiry;
  std::string key_buffer;
  std::vector<ConfirmWrite> sorted;  // record()'s scratch
};

Status ConfirmStore::Impl::open() {
  rocksdb::Options o;
  o.create_if_missing = !read_only_;
  const auto compression = dirs::pick_compression() == rocksdb::kNoCompression
                               ? rocksdb::kNoCompression
                               : rocksdb::kLZ4Compression;
  o.compression = compression;
  o.bottommost_compression = compression;
  o.write_buffer_size = options_.write_buffer_bytes;
  o.max_write_buffer_number = std::max(2, options_.write_buffers);
  o.max_background_jobs = 2;
  o.level_compaction_dynamic_level_bytes = true;
  o.target_file_size_base = 32ULL << 20;
  o.max_bytes_for_level_base = 128ULL << 20;
  o.keep_log_file_num = 4;
  o.max_log_file_size = 8 << 20;
  o.periodic_compaction_seconds = static_cast<std::uint64_t>(options_.periodic_compaction.count());
  o.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  // Without a write-ahead log nothing is to be recovered (kdedup filter
  // starts every run empty): closing need not write the memtables out.
  o.avoid_flush_during_shutdown = !options_.write_ahead_log;
  // Almost every lookup is of a delivered identity (a filter positive),
  // so bloom filters pay only above the last level, which holds most of
  // the entries: their memory is a tenth of a full set's.
  o.optimize_filters_for_hits = true;
  o.compaction_filter_factory = expiry_filter_;
  o.table_factory = confirm_table_factory(options_.block_cache_bytes);
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s =
      read_only_ ? rocksdb::DB::OpenForReadOnly(o, dir_, &raw) : rocksdb::DB::Open(o, dir_, &raw);
  db_.reset(raw);
  if (!s.ok()) return fail(dirs::open_error(s, dir_, read_only_, kWhat));
  return load_metas();
}

Status ConfirmStore::Impl::load_metas() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const std::string first(1, confirm::kMetaTag);
  std::lock_guard lock(mu_);
  for (it->Seek(first); it->Valid() && it->key()[0] == confirm::kMetaTag; it->Next()) {
    auto key = confirm::parse_meta_key(it->key().ToStringView());
    auto meta = confirm::decode_meta(it->value().ToStringView());
    if (!key || !meta) {
      return fail("the confirm store in " + dir_ + " holds a damaged partition record" +
                  (meta ? std::string() : " (" + meta.error().message + ")") +
                  "; move the directory aside and restart: kdedup rebuilds it from Kafka");
    }
    next_id_ = std::max(next_id_, meta->id + 1);
    expiry_->partition(meta->id, meta->ticks_per_window)->horizon.store(meta->horizon);
    metas_.emplace(it->key().ToString(), *meta);
  }
  if (!it->status().ok()) return fail(read_error(it->status(), dir_));
  std::string next;
  if (auto s = db_->Get(rocksdb::ReadOptions(), confirm::kNextIdKey, &next); s.ok()) {
    auto stored = confirm::decode_tick(next);
    if (stored) next_id_ = std::max<std::uint32_t>(next_id_, static_cast<std::uint32_t>(*stored));
  } else if (!s.IsNotFound()) {
    return fail(read_error(s, dir_));
  }
  return {};
}

Result<std::unique_ptr<ConfirmPartition>> ConfirmStore::Impl::attach(
    const PartitionKey& key, const filter::TickScale& scale, std::optional<Restored> restored) {
  if (read_only_) return fail("the confirm store in " + dir_ + " was opened read-only");
  const std::string mkey = confirm::meta_key(key);
  auto shared = std::make_shared<ConfirmPartition::Shared>();
  shared->store = this;
  if (options_.staged) shared->staging = std::make_shared<Staging>();
  std::lock_guard lock(mu_);
  auto it = metas_.find(mkey);
  if (restored) {
    // The snapshot store refused every snapshot the binding does not name
    // (refusal()); anything else here is a bug, and going on would judge
    // with deliveries the filter's snapshot does not know.
    const confirm::Meta* m = it == metas_.end() ? nullptr : &it->second;
    if (m == nullptr || !m->bound || m->bound_offset != restored->next_offset ||
        m->flushing_to >= 0 || m->window_ms != scale.window_ms() ||
        m->ticks_per_window != scale.ticks_per_window()) {
      return fail("internal error: the confirm store of " + key.to_string() +
                  " does not hold the deliveries below the restored snapshot at offset " +
                  std::to_string(restored->next_offset));
    }
    shared->id = m->id;
    shared->expiry = expiry_->partition(m->id, m->ticks_per_window);
  } else {
    // Start empty: the rebuild from Kafka stages what the Slice learns.
    rocksdb::WriteBatch batch;
    confirm::Meta m;
    if (it != metas_.end()) {
      m.id = it->second.id;
      const std::string begin = confirm::entry_prefix(m.id);
      const std::string end = confirm::entry_prefix(m.id + 1);
      if (auto s = batch.DeleteRange(begin, end); !s.ok()) return fail(write_error(s, dir_));
    } else {
      m.id = next_id_++;
      if (auto s = batch.Put(confirm::kNextIdKey, confirm::encode_tick(next_id_)); !s.ok()) {
        return fail(write_error(s, dir_));
      }
    }
    m.window_ms = scale.window_ms();
    m.ticks_per_window = scale.ticks_per_window();
    if (auto s = put_meta(batch, key, m); !s) return tl::unexpected(s.error());
    if (auto s = write(batch); !s) return tl::unexpected(s.error());
    if (it != metas_.end()) {
      // Files holding nothing but this partition's (now deleted) entries go
      // at once instead of at their next compaction.
      const std::string begin = confirm::entry_prefix(m.id);
      const std::string end = confirm::entry_prefix(m.id + 1);
      const rocksdb::Slice b(begin), e(end);
      (void)rocksdb::DeleteFilesInRange(db_.get(), db_->DefaultColumnFamily(), &b, &e);
    }
    expiry_->reset(m.id, m.ticks_per_window);
    metas_[mkey] = m;
    shared->id = m.id;
    shared->expiry = expiry_->partition(m.id, m.ticks_per_window);
  }
  if (shared->staging) {
    staging_[mkey] = shared->staging;
  } else {
    staging_.erase(mkey);
  }
  return std::unique_ptr<ConfirmPartition>(new ConfirmPartition(std::move(shared)));
}

std::optional<std::string> ConfirmStore::Impl::refusal(const SnapshotInfo& info) const {
  const std::string where = "the confirm store of " + info.key.to_string();
  std::lock_guard lock(mu_);
  auto it = metas_.find(confirm::meta_key(info.key));
  if (it == metas_.end()) {
    return where + " holds no deliveries (a new or deleted " + dir_ +
           "): the filter's snapshot cannot be confirmed and the partition is rebuilt from Kafka";
  }
  const confirm::Meta& m = it->second;
  if (m.flushing_to >= 0) {
    return where +
           " was interrupted while moving deliveries to disk; the partition is rebuilt "
           "from Kafka";
  }
  if (!m.bound || m.bound_offset != info.next_offset || m.bound_created_ms != info.created_ms) {
    return where + " belongs to " +
           (m.bound ? "the snapshot at offset " + std::to_string(m.bound_offset)
                    : std::string("no snapshot")) +
           ", not to this one at offset " + std::to_string(info.next_offset) +
           " (a snapshot written without confirmed mode, or a crash between the two writes); "
           "the partition is rebuilt from Kafka";
  }
  if (filter::TickScale(m.window_ms, m.ticks_per_window).fingerprint() !=
      info.fingerprint.tick_scale) {
    return where +
           " was written with another window or ticks_per_window; the partition is "
           "rebuilt from Kafka";
  }
  return std::nullopt;
}

Status ConfirmStore::Impl::flush_for_snapshot(const PartitionKey& key, std::int64_t next_offset,
                                              std::int64_t created_ms, std::int64_t clock_ms) {
  if (read_only_) return fail("the confirm store in " + dir_ + " was opened read-only");
  const std::string mkey = confirm::meta_key(key);
  std::shared_ptr<Staging> staging;
  confirm::Meta meta;
  {
    std::lock_guard lock(mu_);
    auto it = metas_.find(mkey);
    if (it == metas_.end()) return {};  // never attached: no binding to clear
    meta = it->second;
    if (auto s = staging_.find(mkey); s != staging_.end()) staging = s->second;
  }
  if (!staging) {
    // Nothing of this partition was staged in this process: the snapshot's
    // deliveries are not all here.
    meta.bound = false;
    rocksdb::WriteBatch batch;
    if (auto s = put_meta(batch, key, meta); !s) return s;
    if (auto s = write(batch); !s) return s;
  } else {
    std::vector<ConfirmWrite> moving = staging->copy_below(next_offset);
    sort_by_key(moving);
    // Mark the move first: a crash in the middle leaves entries past the
    // binding, and refusal() then refuses every snapshot until a rebuild.
    meta.flushing_to = next_offset;
    rocksdb::WriteBatch batch;
    if (auto s = put_meta(batch, key, meta); !s) return s;
    std::string k;
    for (std::size_t i = 0; i < moving.size(); ++i) {
      confirm::entry_key(meta.id, moving[i].fp, k);
      if (auto s = batch.Put(k, confirm::encode_tick(moving[i].tick)); !s.ok()) {
        return fail(write_error(s, dir_));
      }
      if ((i + 1) % kFlushChunk == 0) {
        if (auto s = write(batch); !s) return s;
        batch.Clear();
      }
    }
    const filter::TickScale scale(std::max<std::int64_t>(1, meta.window_ms),
                                  std::max<std::uint32_t>(1, meta.ticks_per_window));
    meta.flushing_to = -1;
    meta.bound = true;
    meta.bound_offset = next_offset;
    meta.bound_created_ms = created_ms;
    meta.bound_clock_ms = clock_ms;
    meta.horizon = std::max(meta.horizon, scale.tick(clock_ms));
    if (auto s = put_meta(batch, key, meta); !s) return s;
    if (auto s = write(batch); !s) return s;
    // Durable before the manifest: a power loss must not keep a snapshot
    // whose deliveries are gone (a duplicate would then pass).
    if (options_.write_ahead_log) {
      if (auto s = db_->SyncWAL(); !s.ok()) return fail(write_error(s, dir_));
    }
    staging->drop_below(next_offset);
    expiry_->set_horizon(meta.id, meta.horizon);
  }
  std::lock_guard lock(mu_);
  metas_[mkey] = meta;
  return {};
}

std::uint64_t ConfirmStore::Impl::range_bytes(std::uint32_t id) const {
  const std::string begin = confirm::entry_prefix(id);
  const std::string end = confirm::entry_prefix(id + 1);
  rocksdb::Range range(begin, end);
  rocksdb::SizeApproximationOptions approx;
  approx.include_memtables = true;
  approx.include_files = true;
  std::uint64_t size = 0;
  if (!db_->GetApproximateSizes(approx, db_->DefaultColumnFamily(), &range, 1, &size).ok()) {
    return 0;
  }
  return size;
}

std::uint64_t ConfirmStore::Impl::total_bytes() const {
  std::uint64_t sst = 0, mem = 0;
  (void)db_->GetIntProperty("rocksdb.live-sst-files-size", &sst);
  (void)db_->GetIntProperty("rocksdb.cur-size-all-mem-tables", &mem);
  return sst + mem;
}

Result<std::vector<ConfirmPartitionInfo>> ConfirmStore::Impl::list(bool count) const {
  std::map<std::string, confirm::Meta> metas;
  {
    std::lock_guard lock(mu_);
    metas = metas_;
  }
  std::uint64_t keys = 0;
  (void)db_->GetIntProperty("rocksdb.estimate-num-keys", &keys);
  const std::uint64_t total = std::max<std::uint64_t>(1, total_bytes());
  std::vector<ConfirmPartitionInfo> out;
  for (const auto& [mkey, m] : metas) {
    ConfirmPartitionInfo info;
    info.key = *confirm::parse_meta_key(mkey);
    info.id = m.id;
    info.window_ms = m.window_ms;
    info.ticks_per_window = m.ticks_per_window;
    if (m.bound && m.flushing_to < 0) info.snapshot_offset = m.bound_offset;
    info.snapshot_created_ms = m.bound_created_ms;
    info.horizon = m.horizon;
    info.approximate_bytes = range_bytes(m.id);
    info.approximate_entries = static_cast<std::uint64_t>(
        static_cast<double>(keys) * static_cast<double>(info.approximate_bytes) /
        static_cast<double>(total));
    if (count) {
      std::uint64_t entries = 0, live = 0;
      const std::string begin = confirm::entry_prefix(m.id);
      const std::string end = confirm::entry_prefix(m.id + 1);
      rocksdb::ReadOptions ro;
      rocksdb::Slice upper(end);
      ro.iterate_upper_bound = &upper;
      ro.fill_cache = false;
      std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
      for (it->Seek(begin); it->Valid(); it->Next()) {
        ++entries;
        const auto tick = confirm::decode_tick(it->value().ToStringView());
        if (tick && !(m.horizon > *tick && m.horizon - *tick > m.ticks_per_window)) ++live;
      }
      if (!it->status().ok()) return fail(read_error(it->status(), dir_));
      info.entries = entries;
      info.live_entries = live;
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.key.topic != b.key.topic ? a.key.topic < b.key.topic
                                      : a.key.partition < b.key.partition;
  });
  return out;
}

// ---- ConfirmPartition ----

ConfirmPartition::ConfirmPartition(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
ConfirmPartition::~ConfirmPartition() = default;

Status ConfirmPartition::lookup(std::span<const filter::Fingerprint> fps,
                                std::span<std::optional<filter::Tick>> ticks) {
  misses_.clear();
  std::fill(ticks.begin(), ticks.end(), std::nullopt);
  if (shared_->staging) {
    shared_->staging->lookup(fps, ticks, misses_);
  } else {
    for (std::size_t i = 0; i < fps.size(); ++i) misses_.push_back(i);
  }
  if (misses_.empty()) return {};
  const std::size_t n = misses_.size();
  keys_.resize(n);
  std::vector<rocksdb::Slice> slices(n);
  for (std::size_t j = 0; j < n; ++j) {
    confirm::entry_key(shared_->id, fps[misses_[j]], keys_[j]);
    slices[j] = rocksdb::Slice(keys_[j]);
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  rocksdb::DB& db = *shared_->store->db_;
  db.MultiGet(rocksdb::ReadOptions(), db.DefaultColumnFamily(), n, slices.data(), values.data(),
              statuses.data());
  for (std::size_t j = 0; j < n; ++j) {
    if (statuses[j].IsNotFound()) continue;
    if (!statuses[j].ok()) return fail(read_error(statuses[j], shared_->store->dir_));
    if (auto tick = confirm::decode_tick(values[j].ToStringView())) ticks[misses_[j]] = *tick;
  }
  return {};
}

Status ConfirmPartition::record(std::span<const ConfirmWrite> writes) {
  if (writes.empty()) return {};
  if (shared_->staging) {
    shared_->staging->append(writes);
    return {};
  }
  shared_->sorted.assign(writes.begin(), writes.end());
  sort_by_key(shared_->sorted);
  rocksdb::WriteBatch batch;
  for (const ConfirmWrite& w : shared_->sorted) {
    confirm::entry_key(shared_->id, w.fp, shared_->key_buffer);
    if (auto s = batch.Put(shared_->key_buffer, confirm::encode_tick(w.tick)); !s.ok()) {
      return fail(write_error(s, shared_->store->dir_));
    }
  }
  return shared_->store->write(batch);
}

void ConfirmPartition::advance(filter::Tick now) noexcept {
  // Staged mode expires at the bound snapshot's clock (flush_for_snapshot).
  if (shared_->staging) return;
  std::uint64_t h = shared_->expiry->horizon.load(std::memory_order_relaxed);
  if (now > h) shared_->expiry->horizon.store(now, std::memory_order_relaxed);
}

std::uint64_t ConfirmPartition::approximate_bytes() const {
  return shared_->store->range_bytes(shared_->id);
}

std::uint64_t ConfirmPartition::staged() const {
  return shared_->staging ? shared_->staging->size() : 0;
}

std::uint64_t ConfirmPartition::staged_bytes() const {
  return shared_->staging ? shared_->staging->bytes() : 0;
}

// ---- ConfirmStore ----

ConfirmStore::ConfirmStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConfirmStore::~ConfirmStore() = default;

Result<std::unique_ptr<ConfirmStore>> ConfirmStore::open(const std::string& dir,
                                                         ConfirmOptions options) {
  if (auto ok = dirs::prepare(dir, false, kWhat); !ok) return tl::unexpected(ok.error());
  auto impl = std::make_unique<Impl>(dir, options, false);
  if (auto ok = impl->open(); !ok) return tl::unexpected(ok.error());
  return std::unique_ptr<ConfirmStore>(new ConfirmStore(std::move(impl)));
}

Result<std::unique_ptr<ConfirmStore>> ConfirmStore::open_read_only(const std::string& dir) {
  if (auto ok = dirs::prepare(dir, true, kWhat); !ok) return tl::unexpected(ok.error());
  auto impl = std::make_unique<Impl>(dir, ConfirmOptions{}, true);
  if (auto ok = impl->open(); !ok) return tl::unexpected(ok.error());
  return std::unique_ptr<ConfirmStore>(new ConfirmStore(std::move(impl)));
}

Result<std::unique_ptr<ConfirmPartition>> ConfirmStore::attach(const PartitionKey& key,
                                                               const filter::TickScale& scale,
                                                               std::optional<Restored> restored) {
  return impl_->attach(key, scale, restored);
}

std::optional<std::string> ConfirmStore::refusal(const SnapshotInfo& info) const {
  return impl_->refusal(info);
}

Status ConfirmStore::flush_for_snapshot(const PartitionKey& key, std::int64_t next_offset,
                                        std::int64_t created_ms, std::int64_t clock_ms) {
  return impl_->flush_for_snapshot(key, next_offset, created_ms, clock_ms);
}

Result<std::vector<ConfirmPartitionInfo>> ConfirmStore::list(bool count) const {
  return impl_->list(count);
}

std::uint64_t ConfirmStore::approximate_bytes() const { return impl_->total_bytes(); }

std::uint64_t ConfirmStore::memory_bytes() const {
  std::uint64_t cache = 0, mem = 0, readers = 0;
  rocksdb::DB& db = *impl_->db_;
  (void)db.GetIntProperty("rocksdb.block-cache-usage", &cache);
  (void)db.GetIntProperty("rocksdb.cur-size-all-mem-tables", &mem);
  (void)db.GetIntProperty("rocksdb.estimate-table-readers-mem", &readers);
  return cache + mem + readers;
}

Status ConfirmStore::compact() {
  if (impl_->read_only_)
    return fail("the confirm store in " + impl_->dir_ + " was opened read-only");
  return impl_->compact();
}

std::uint64_t ConfirmStore::expired() const noexcept { return impl_->expiry_filter_->dropped(); }

const std::string& ConfirmStore::dir() const noexcept { return impl_->dir_; }
const ConfirmOptions& ConfirmStore::options() const noexcept { return impl_->options_; }

}  // namespace kdedup::state
