// Confirmed mode measured (docs/performance.md "Confirmed mode"). Prints
// markdown tables; asserts nothing.
//
// 1. Side by side, on the same streams (seed 000 §7 generators: Zipf keys
//    with a 5x burst and uniform keys with a 2x burst, ~40% duplicates; and
//    a uniform stream with ~10% duplicates), one thread, batches of 512
//    records (kdedup run's batch_size):
//    - timer alone: the 8-bit timer filter (Slice::decide, as kdedup run);
//    - confirmed timer, staged: the same filter and a ConfirmStore in
//      kdedup run's mode: deliveries staged in memory and moved to RocksDB
//      (sorted, one WriteBatch per 64k) every --snapshot-records records, as
//      a snapshot moves them; the move runs inline here (kdedup run: on the
//      snapshot writer thread), so its CPU is in the figures;
//    - confirmed timer, per batch: deliveries written to RocksDB in one
//      WriteBatch per record batch (no staging);
//    - exact in memory: the exact filter (salted 128-bit fingerprint -> tick);
//    (streams: Zipf alpha 0.8 from 3 million identities, uniform from
//    400,000, uniform from 2 million, at 700 / 1,100 / 1,100 records per
//    tick and 192 ticks per window: ~42%, ~42% and ~9% duplicates);
//    - RocksDB get+put per record: the Kafka Streams way, one Get for every
//      record and one Put for every distinct one, no batching and no
//      write-ahead log (Kafka Streams keeps its changelog in Kafka), on the
//      same store (same RocksDB settings, caches and expiry filter).
//    Columns: records/s; CPU seconds per million records (the process's CPU
//    time, RocksDB's background threads included); RAM: the filter's bits
//    per identity in the window, and what RocksDB and the staging hold
//    (block cache, memtables, table readers; bounded by the settings, not by
//    the identities); disk bytes per identity in the window after a final
//    compaction; FP and FN against the exact filter's decisions.
// 2. Expiry: the store's layout (fingerprint keys, expiry by a compaction
//    filter) against time-bucketed keys (bucket | fingerprint, 4 buckets
//    per window, a lookup reads every live bucket, a bucket is range-deleted
//    once it is a window old) on a steady stream of 20 windows, per-batch
//    writes: records/s, CPU, keys read per lookup, disk per identity in the
//    window at the end (without and with a final compaction), on average
//    over the run (sampled every quarter window) and at the peak.
// 3. --big: 50 million identities in a 24-hour window (event time
//    compressed: 36 h of it, ~120 million records, 40% of them repeats of an
//    identity delivered within the last 0.9 windows, so the truth is known
//    without an exact filter), confirmed timer at fpp 0.01, staged with a
//    move every 1,000,000 records; progress every 10 million records: the
//    filter's bytes, RocksDB's memory, the staging, the process's resident
//    set, the store on disk, records/s, FP and FN.
//
// Usage: confirm_bench [--scale X] [--snapshot-records N] [--dir DIR]
//                      [--skip-side] [--skip-expiry] [--big]

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/tick_scale.h"
#include "kdedup/pipeline/confirm.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/state/confirm_store.h"
#include "streams.h"

namespace {

namespace fs = std::filesystem;
using kdedup::filter::Decision;
using kdedup::filter::Fingerprint;
using kdedup::filter::Tick;
using kdedup::testing::Event;
using kdedup::testing::StreamSpec;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kTicks = 192;  // the 8-bit timer filter's default
constexpr std::int64_t kWindowMs = 60'000;
constexpr std::size_t kBatch = 512;
const kdedup::filter::TickScale kScale(kWindowMs, kTicks);
const kdedup::state::PartitionKey kKey{"bench", 0};

struct Options {
  double scale = 1.0;
  std::uint64_t snapshot_records = 1'000'000;
  std::string dir;  ///< default: $TMPDIR (or /tmp)/kdedup-confirm-bench
  bool side = true, expiry = true, big = false;
};

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

/// VmRSS of this process, MiB.
double rss_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0;
}

double mib(std::uint64_t b) { return static_cast<double>(b) / 1048576.0; }

std::string fresh_dir(const Options& o, const std::string& name) {
  const std::string d = o.dir + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

kdedup::pipeline::SliceOptions slice_options(kdedup::filter::FilterType type, double fpp,
                                             kdedup::state::ConfirmStore* confirm) {
  kdedup::pipeline::SliceOptions o;
  o.window_ms = kWindowMs;
  o.filter.type = type;
  o.filter.ticks_per_window = kTicks;
  o.filter.fpp = fpp;
  o.filter.capacity = 100'000;
  o.confirm = confirm;
  return o;
}

/// What one mode did on one stream.
struct Row {
  std::string mode;
  double seconds = 0, cpu = 0;
  std::uint64_t filter_bytes = 0, rocksdb_bytes = 0, staged_bytes = 0, disk_bytes = 0;
  std::uint64_t fp = 0, fn = 0, lookups = 0, prevented = 0;
  bool has_store = false, has_filter = true;
};

struct Stream {
  std::string name;
  std::vector<Event> events;
  std::vector<Decision> truth;   // the exact filter's decisions
  std::uint64_t window_ids = 0;  // identities delivered within the last window
  std::uint64_t duplicates = 0;
};

void score(Row& r, const std::vector<Decision>& got, const Stream& s) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == Decision::kDuplicate && s.truth[i] == Decision::kDistinct) ++r.fp;
    if (got[i] == Decision::kDistinct && s.truth[i] == Decision::kDuplicate) ++r.fn;
  }
}

/// Runs `slice` over the stream in batches; `every` is called after each
/// batch with the next offset (moves of staged deliveries).
template <class Every>
std::vector<Decision> run_slice(kdedup::pipeline::Slice& slice, const Stream& s, Every every) {
  std::vector<Decision> out(s.events.size());
  std::vector<Fingerprint> fps;
  std::vector<Tick> ticks;
  std::vector<std::int64_t> offsets;
  for (std::size_t i = 0; i < s.events.size(); i += kBatch) {
    const std::size_t end = std::min(s.events.size(), i + kBatch);
    fps.clear();
    ticks.clear();
    offsets.clear();
    for (std::size_t j = i; j < end; ++j) {
      fps.push_back(s.events[j].fp);
      ticks.push_back(s.events[j].tick);
      offsets.push_back(static_cast<std::int64_t>(j));
    }
    slice.decide(fps, ticks, std::span(out).subspan(i, end - i), {}, offsets);
    if (slice.failure()) {
      std::fprintf(stderr, "confirm_bench: %s\n", slice.failure()->c_str());
      std::exit(1);
    }
    every(static_cast<std::int64_t>(end), s.events[end - 1].tick);
  }
  return out;
}

Row filter_alone(const Stream& s, kdedup::filter::FilterType type, const char* name) {
  Row r;
  r.mode = name;
  auto slice = kdedup::pipeline::Slice::create({"bench", 0}, slice_options(type, 0.01, nullptr));
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  const auto got = run_slice(**slice, s, [](std::int64_t, Tick) {});
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu = cpu_seconds() - c0;
  r.filter_bytes = (*slice)->filter()->stats().bytes;
  score(r, got, s);
  return r;
}

Row confirmed(const Options& o, const Stream& s, bool staged) {
  Row r;
  r.mode = staged ? "confirmed timer, staged" : "confirmed timer, per batch";
  r.has_store = true;
  kdedup::state::ConfirmOptions co;
  co.staged = staged;
  co.write_ahead_log = staged;  // kdedup run keeps it (synced per snapshot)
  auto store = kdedup::state::ConfirmStore::open(fresh_dir(o, "confirmed"), co);
  if (!store) {
    std::fprintf(stderr, "confirm_bench: %s\n", store.error().message.c_str());
    std::exit(1);
  }
  auto slice = kdedup::pipeline::Slice::create(
      {"bench", 0}, slice_options(kdedup::filter::FilterType::kTimer, 0.01, store->get()));
  std::uint64_t staged_peak = 0;
  std::int64_t last_move = 0;
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  const auto got = run_slice(**slice, s, [&](std::int64_t next, Tick tick) {
    if (!staged || next - last_move < static_cast<std::int64_t>(o.snapshot_records)) return;
    staged_peak = std::max(staged_peak, (*slice)->confirmer()->store().staged_bytes());
    last_move = next;
    (void)(*store)->flush_for_snapshot(kKey, next, next, kScale.start_ms(tick));
  });
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu = cpu_seconds() - c0;
  r.filter_bytes = (*slice)->filter()->stats().bytes;
  r.rocksdb_bytes = (*store)->memory_bytes();
  r.staged_bytes = std::max(staged_peak, (*slice)->confirmer()->store().staged_bytes());
  const auto counts = (*slice)->counters()->confirm.read();
  r.lookups = counts.lookups;
  r.prevented = counts.prevented;
  if (staged) {
    (void)(*store)->flush_for_snapshot(kKey, static_cast<std::int64_t>(s.events.size()), 0,
                                       kScale.start_ms(s.events.back().tick));
  }
  (void)(*store)->compact();
  r.disk_bytes = (*store)->approximate_bytes();
  score(r, got, s);
  return r;
}

/// One Get per record, one Put per distinct record: the same store, with
/// one-element calls.
Row get_put(const Options& o, const Stream& s) {
  Row r;
  r.mode = "RocksDB get+put per record";
  r.has_store = true;
  r.has_filter = false;
  kdedup::state::ConfirmOptions co;
  co.staged = false;
  co.write_ahead_log = false;
  auto store = kdedup::state::ConfirmStore::open(fresh_dir(o, "getput"), co);
  auto part = (*store)->attach(kKey, kScale, std::nullopt);
  std::vector<Decision> got(s.events.size());
  std::optional<Tick> found[1];
  kdedup::state::ConfirmWrite w[1];
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < s.events.size(); ++i) {
    const Event& e = s.events[i];
    if (!(*part)->lookup(std::span(&e.fp, 1), found)) std::exit(1);
    if (found[0] && e.tick - *found[0] <= kTicks) {
      got[i] = Decision::kDuplicate;
      continue;
    }
    got[i] = Decision::kDistinct;
    w[0] = {e.fp, e.tick, static_cast<std::int64_t>(i)};
    if (!(*part)->record(w)) std::exit(1);
    (*part)->advance(e.tick);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu = cpu_seconds() - c0;
  r.rocksdb_bytes = (*store)->memory_bytes();
  (void)(*store)->compact();
  r.disk_bytes = (*store)->approximate_bytes();
  r.lookups = s.events.size();
  score(r, got, s);
  return r;
}

Stream make_stream(std::string name, StreamSpec spec) {
  Stream s;
  s.name = std::move(name);
  s.events = kdedup::testing::generate_stream(spec);
  auto exact = kdedup::pipeline::Slice::create(
      {"bench", 0}, slice_options(kdedup::filter::FilterType::kExact, 0.01, nullptr));
  s.truth = run_slice(**exact, s, [](std::int64_t, Tick) {});
  s.window_ids = (*exact)->filter()->stats().live_cells;
  for (Decision d : s.truth) s.duplicates += d == Decision::kDuplicate;
  return s;
}

void print_row(const Row& r, const Stream& s) {
  const double n = static_cast<double>(s.events.size());
  const double ids = static_cast<double>(std::max<std::uint64_t>(1, s.window_ids));
  std::printf(
      "| %s | %.0f | %.2f | %s | %s | %s | %llu | %llu | %llu | %llu |\n", r.mode.c_str(),
      n / r.seconds, r.cpu / n * 1e6,
      r.has_filter
          ? std::to_string(static_cast<int>(static_cast<double>(r.filter_bytes) * 8 / ids + 0.5))
                .c_str()
          : "0",
      r.has_store ? (std::to_string(static_cast<int>(mib(r.rocksdb_bytes) + 0.5)) + " + " +
                     std::to_string(static_cast<int>(mib(r.staged_bytes) + 0.5)))
                        .c_str()
                  : "-",
      r.has_store
          ? std::to_string(static_cast<int>(static_cast<double>(r.disk_bytes) / ids + 0.5)).c_str()
          : "-",
      static_cast<unsigned long long>(r.fp), static_cast<unsigned long long>(r.fn),
      static_cast<unsigned long long>(r.lookups), static_cast<unsigned long long>(r.prevented));
}

void side_by_side(const Options& o) {
  auto scaled = [&](double rate) { return rate * o.scale; };
  StreamSpec zipf;
  zipf.distribution = kdedup::testing::Distribution::kZipf;
  zipf.zipf_alpha = 0.8;  // alpha 1 puts ~70% of the records on repeats
  zipf.domain = static_cast<std::uint64_t>(3'000'000 * o.scale);
  zipf.base_rate = scaled(700);
  zipf.ticks = 12 * kTicks;
  zipf.burst_factor = 5;
  zipf.seed = 1;
  StreamSpec uniform;
  uniform.domain = static_cast<std::uint64_t>(400'000 * o.scale);
  uniform.base_rate = scaled(1'100);
  uniform.ticks = 12 * kTicks;
  uniform.burst_factor = 2;
  uniform.seed = 2;
  StreamSpec fresh = uniform;
  fresh.domain = static_cast<std::uint64_t>(2'000'000 * o.scale);
  fresh.burst_factor = 1;
  fresh.seed = 3;
  std::printf(
      "## Side by side (fpp 0.01, window %d ticks, batches of %zu, moves every %llu "
      "records)\n\n",
      kTicks, kBatch, static_cast<unsigned long long>(o.snapshot_records));
  for (auto& [name, spec] : {std::pair<const char*, StreamSpec>{"Zipf keys, 5x burst", zipf},
                             {"uniform keys, 2x burst", uniform},
                             {"uniform keys, few duplicates", fresh}}) {
    const Stream s = make_stream(name, spec);
    std::printf("### %s: %zu records, %.1f%% duplicates, %llu identities in the last window\n\n",
                name, s.events.size(),
                100.0 * static_cast<double>(s.duplicates) / static_cast<double>(s.events.size()),
                static_cast<unsigned long long>(s.window_ids));
    std::printf(
        "| mode | records/s | CPU s per M records | filter bits/id | RocksDB + staging "
        "MiB | disk B/id | FP | FN | lookups | prevented |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::vector<Row> rows;
    rows.push_back(filter_alone(s, kdedup::filter::FilterType::kTimer, "timer alone"));
    rows.push_back(confirmed(o, s, true));
    rows.push_back(confirmed(o, s, false));
    rows.push_back(filter_alone(s, kdedup::filter::FilterType::kExact, "exact in memory"));
    rows.push_back(get_put(o, s));
    for (const Row& r : rows) print_row(r, s);
    const double confirmed_rate = static_cast<double>(s.events.size()) / rows[1].seconds;
    std::printf("\nconfirmed (staged) / timer alone: %.2f; / RocksDB get+put: %.2f\n\n",
                rows[0].seconds / rows[1].seconds,
                confirmed_rate / (static_cast<double>(s.events.size()) / rows[4].seconds));
    std::fflush(stdout);
  }
}

// ---- 2. Expiry layouts ----------------------------------------------------

/// The alternative layout: bucket (u32 BE) | fp.hi | fp.lo -> tick, four
/// buckets per window. A lookup reads every bucket that can hold a live
/// delivery (the newest found wins); a bucket whose last tick is more than a
/// window old is range-deleted and its files dropped. Same RocksDB settings
/// as the ConfirmStore, without the compaction filter.
class BucketStore {
 public:
  static constexpr Tick kBucketTicks = kTicks / 4;

  explicit BucketStore(const std::string& dir) {
    rocksdb::Options o;
    o.create_if_missing = true;
    o.compression = rocksdb::kLZ4Compression;
    o.write_buffer_size = 16ULL << 20;
    o.max_write_buffer_number = 2;
    o.max_background_jobs = 2;
    o.level_compaction_dynamic_level_bytes = true;
    o.target_file_size_base = 32ULL << 20;
    o.max_bytes_for_level_base = 128ULL << 20;
    // The confirm store's tables (a lookup misses in most of the buckets it
    // reads: bloom filters on every level, as optimize_filters_for_hits is
    // not set here).
    o.table_factory = kdedup::state::confirm_table_factory(32ULL << 20);
    rocksdb::DB* raw = nullptr;
    if (!rocksdb::DB::Open(o, dir, &raw).ok()) std::exit(1);
    db_.reset(raw);
  }

  static std::string key(Tick bucket, const Fingerprint& fp) {
    std::string k;
    for (int s = 24; s >= 0; s -= 8) k.push_back(static_cast<char>(bucket >> s));
    for (int s = 56; s >= 0; s -= 8) k.push_back(static_cast<char>(fp.hi >> s));
    for (int s = 56; s >= 0; s -= 8) k.push_back(static_cast<char>(fp.lo >> s));
    return k;
  }

  void lookup(std::span<const Fingerprint> fps, Tick now, std::vector<std::optional<Tick>>& out) {
    const Tick first = (now > kTicks ? now - kTicks : 0) / kBucketTicks;
    const Tick last = now / kBucketTicks;
    keys_.clear();
    for (const Fingerprint& fp : fps) {
      for (Tick b = first; b <= last; ++b) keys_.push_back(key(b, fp));
    }
    std::vector<rocksdb::Slice> slices(keys_.begin(), keys_.end());
    std::vector<rocksdb::PinnableSlice> values(keys_.size());
    std::vector<rocksdb::Status> statuses(keys_.size());
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), keys_.size(), slices.data(),
                  values.data(), statuses.data());
    const std::size_t per = static_cast<std::size_t>(last - first + 1);
    out.assign(fps.size(), std::nullopt);
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (!statuses[i].ok()) continue;
      Tick t = 0;
      std::memcpy(&t, values[i].data(), sizeof t);
      auto& o = out[i / per];
      if (!o || t > *o) o = t;
    }
  }

  void record(std::vector<kdedup::state::ConfirmWrite>& writes) {
    std::sort(writes.begin(), writes.end(), [](const auto& a, const auto& b) {
      return a.tick / kBucketTicks != b.tick / kBucketTicks
                 ? a.tick < b.tick
                 : (a.fp.hi != b.fp.hi ? a.fp.hi < b.fp.hi : a.fp.lo < b.fp.lo);
    });
    rocksdb::WriteBatch batch;
    for (const auto& w : writes) {
      batch.Put(key(w.tick / kBucketTicks, w.fp),
                rocksdb::Slice(reinterpret_cast<const char*>(&w.tick), sizeof w.tick));
    }
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;
    if (!db_->Write(wo, &batch).ok()) std::exit(1);
  }

  void advance(Tick now) {
    while ((dropped_ + 1) * kBucketTicks - 1 + kTicks < now) {
      const std::string b = key(dropped_, {0, 0}).substr(0, 4);
      const std::string e = key(dropped_ + 1, {0, 0}).substr(0, 4);
      rocksdb::WriteOptions wo;
      wo.disableWAL = true;
      (void)db_->DeleteRange(wo, db_->DefaultColumnFamily(), b, e);
      const rocksdb::Slice bs(b), es(e);
      (void)rocksdb::DeleteFilesInRange(db_.get(), db_->DefaultColumnFamily(), &bs, &es);
      ++dropped_;
    }
  }

  std::uint64_t bytes() const {
    std::uint64_t sst = 0, mem = 0;
    (void)db_->GetIntProperty("rocksdb.live-sst-files-size", &sst);
    (void)db_->GetIntProperty("rocksdb.cur-size-all-mem-tables", &mem);
    return sst + mem;
  }
  void compact() {
    rocksdb::CompactRangeOptions o;
    o.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    (void)db_->CompactRange(o, nullptr, nullptr);
  }

 private:
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<std::string> keys_;
  Tick dropped_ = 0;
};

/// One layout over the stream: every truth-duplicate and 1% of the distinct
/// records (the filter's positives, roughly) looked up per batch, every
/// distinct record written per batch. Prints one row.
template <class Lookup, class Write, class Advance, class Bytes, class Compact>
void run_layout(const char* name, int keys_per_lookup, const Stream& s, Lookup lookup, Write write,
                Advance advance, Bytes bytes, Compact compact) {
  std::vector<Fingerprint> positives;
  std::vector<std::optional<Tick>> found;
  std::vector<kdedup::state::ConfirmWrite> writes;
  std::uint64_t peak = 0, samples = 0;
  double sampled = 0;
  Tick last_sample = 0;
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < s.events.size(); i += kBatch) {
    const std::size_t end = std::min(s.events.size(), i + kBatch);
    positives.clear();
    writes.clear();
    for (std::size_t j = i; j < end; ++j) {
      const bool dup = s.truth[j] == Decision::kDuplicate;
      if (dup || s.events[j].fp.lo % 100 == 0) positives.push_back(s.events[j].fp);
      if (!dup) writes.push_back({s.events[j].fp, s.events[j].tick, static_cast<std::int64_t>(j)});
    }
    const Tick now = s.events[end - 1].tick;
    lookup(positives, now, found);
    write(writes);
    advance(now);
    if (now >= last_sample + kTicks / 4) {
      last_sample = now;
      const std::uint64_t b = bytes();
      peak = std::max(peak, b);
      // From the second window on: the first has nothing to expire yet.
      if (now > kTicks) {
        sampled += static_cast<double>(b);
        ++samples;
      }
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  const std::uint64_t end_bytes = bytes();
  peak = std::max(peak, end_bytes);
  compact();
  const double ids = static_cast<double>(s.window_ids);
  const double n = static_cast<double>(s.events.size());
  std::printf("| %s | %.0f | %.2f | %d | %.1f | %.1f | %.1f | %.1f |\n", name, n / secs,
              cpu / n * 1e6, keys_per_lookup, static_cast<double>(end_bytes) / ids,
              static_cast<double>(bytes()) / ids,
              sampled / static_cast<double>(std::max<std::uint64_t>(1, samples)) / ids,
              static_cast<double>(peak) / ids);
  std::fflush(stdout);
}

void expiry_layouts(const Options& o) {
  StreamSpec steady;
  steady.domain = static_cast<std::uint64_t>(200'000 * o.scale);
  steady.base_rate = 700 * o.scale;
  steady.ticks = 20 * kTicks;
  steady.seed = 4;
  const Stream s = make_stream("steady", steady);
  std::printf(
      "## Expiry: fingerprint keys + compaction filter vs time-bucketed keys + range "
      "deletes\n\n%zu records over 20 windows, %.1f%% duplicates, %llu identities in "
      "the last window; lookups of every duplicate and 1%% of the rest, writes per "
      "batch of %zu\n\n",
      s.events.size(),
      100.0 * static_cast<double>(s.duplicates) / static_cast<double>(s.events.size()),
      static_cast<unsigned long long>(s.window_ids), kBatch);
  std::printf(
      "| layout | records/s | CPU s per M records | keys read per lookup | disk B/id at the "
      "end | after a full compaction | average | peak |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  {
    kdedup::state::ConfirmOptions co;
    co.staged = false;
    co.write_ahead_log = false;
    auto store = kdedup::state::ConfirmStore::open(fresh_dir(o, "layout-a"), co);
    auto part = (*store)->attach(kKey, kScale, std::nullopt);
    run_layout(
        "fingerprint keys, compaction filter", 1, s,
        [&](std::span<const Fingerprint> fps, Tick, std::vector<std::optional<Tick>>& out) {
          out.assign(fps.size(), std::nullopt);
          (void)(*part)->lookup(fps, out);
        },
        [&](std::vector<kdedup::state::ConfirmWrite>& w) { (void)(*part)->record(w); },
        [&](Tick now) { (*part)->advance(now); }, [&] { return (*store)->approximate_bytes(); },
        [&] { (void)(*store)->compact(); });
  }
  {
    // Every bucket a live delivery can be in: ceil(W / bucket) + 1.
    BucketStore store(fresh_dir(o, "layout-b"));
    run_layout(
        "time buckets (4 per window), range deletes", 5, s,
        [&](std::span<const Fingerprint> fps, Tick now, std::vector<std::optional<Tick>>& out) {
          store.lookup(fps, now, out);
        },
        [&](std::vector<kdedup::state::ConfirmWrite>& w) { store.record(w); },
        [&](Tick now) { store.advance(now); }, [&] { return store.bytes(); },
        [&] { store.compact(); });
  }
  std::printf("\n");
}

// ---- 3. 50 million identities, 24-hour window ----------------------------

void big_run(const Options& o) {
  constexpr std::int64_t kDayMs = 24LL * 3600 * 1000;
  const kdedup::filter::TickScale day(kDayMs, kTicks);
  const std::uint64_t ids_per_window = static_cast<std::uint64_t>(50'000'000 * o.scale);
  const Tick span_ticks = kTicks * 3 / 2;  // 36 h of event time
  const std::uint64_t new_per_tick = ids_per_window / kTicks;
  const std::uint64_t records = new_per_tick * span_ticks * 10 / 6;  // 40% repeats
  std::printf(
      "## %llu identities in a 24 h window (36 h of event time, %llu records, 40%% of "
      "them repeats within the last 0.9 window), confirmed timer at fpp 0.01, staged, "
      "moves every %llu records\n\n",
      static_cast<unsigned long long>(ids_per_window), static_cast<unsigned long long>(records),
      static_cast<unsigned long long>(o.snapshot_records));
  kdedup::state::ConfirmOptions co;
  co.periodic_compaction = std::chrono::seconds(86400);
  auto store = kdedup::state::ConfirmStore::open(fresh_dir(o, "big"), co);
  if (!store) {
    std::fprintf(stderr, "confirm_bench: %s\n", store.error().message.c_str());
    std::exit(1);
  }
  auto so = slice_options(kdedup::filter::FilterType::kTimer, 0.01, store->get());
  so.window_ms = kDayMs;
  auto slice = kdedup::pipeline::Slice::create({"bench", 0}, so);
  std::mt19937_64 rng(99);
  std::vector<Fingerprint> fps;
  std::vector<Tick> ticks;
  std::vector<std::int64_t> offsets;
  std::vector<std::uint8_t> is_new;
  std::vector<Decision> out;
  std::uint64_t next_id = 0, fp_count = 0, fn_count = 0, done = 0, last_move = 0;
  std::uint64_t filter_peak = 0, rocks_peak = 0, staged_peak = 0;
  double rss_peak = 0;
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  std::printf(
      "| records | s | records/s | filter MiB | RocksDB MiB | staged MiB | RSS MiB | "
      "store on disk MiB | FP | FN |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  auto progress = [&] {
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto fbytes = (*slice)->filter()->stats().bytes;
    const auto rbytes = (*store)->memory_bytes();
    const auto sbytes = (*slice)->confirmer()->store().staged_bytes();
    const double rss = rss_mib();
    filter_peak = std::max<std::uint64_t>(filter_peak, fbytes);
    rocks_peak = std::max(rocks_peak, rbytes);
    staged_peak = std::max(staged_peak, sbytes);
    rss_peak = std::max(rss_peak, rss);
    std::printf("| %llu | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %llu | %llu |\n",
                static_cast<unsigned long long>(done), secs, static_cast<double>(done) / secs,
                mib(fbytes), mib(rbytes), mib(sbytes), rss, mib((*store)->approximate_bytes()),
                static_cast<unsigned long long>(fp_count),
                static_cast<unsigned long long>(fn_count));
    std::fflush(stdout);
  };
  const std::uint64_t per_tick = records / span_ticks;
  while (done < records) {
    fps.clear();
    ticks.clear();
    offsets.clear();
    is_new.clear();
    for (std::size_t j = 0; j < kBatch && done + j < records; ++j) {
      const std::uint64_t r = done + j;
      const Tick tick = r / per_tick;
      const std::uint64_t recent = static_cast<std::uint64_t>(0.9 * kTicks) * new_per_tick;
      std::uint64_t id;
      const bool fresh = next_id == 0 || rng() % 10 >= 4;
      if (fresh) {
        id = next_id++;
      } else {
        id = next_id - 1 - rng() % std::min(next_id, recent);
      }
      fps.push_back(kdedup::testing::identity_fingerprint(id, 7));
      ticks.push_back(tick);
      offsets.push_back(static_cast<std::int64_t>(r));
      is_new.push_back(fresh ? 1 : 0);
    }
    out.resize(fps.size());
    (*slice)->decide(fps, ticks, out, {}, offsets);
    if ((*slice)->failure()) {
      std::fprintf(stderr, "confirm_bench: %s\n", (*slice)->failure()->c_str());
      std::exit(1);
    }
    for (std::size_t j = 0; j < out.size(); ++j) {
      fp_count += is_new[j] && out[j] == Decision::kDuplicate;
      fn_count += !is_new[j] && out[j] == Decision::kDistinct;
    }
    done += fps.size();
    if (done - last_move >= o.snapshot_records) {
      last_move = done;
      (void)(*store)->flush_for_snapshot(kKey, static_cast<std::int64_t>(done),
                                         static_cast<std::int64_t>(done),
                                         day.start_ms(ticks.back()));
    }
    if (done % 10'000'000 < kBatch) progress();
  }
  progress();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  const auto counts = (*slice)->counters()->confirm.read();
  const double disk = static_cast<double>((*store)->approximate_bytes());
  std::printf(
      "\n%.0f s, %.0f records/s, %.2f CPU s per million records; filter peak %.0f MiB (%.1f "
      "bits per identity in the window), RocksDB peak %.0f MiB, staging peak %.0f MiB, RSS peak "
      "%.0f MiB; store %.0f MiB on disk (%.1f bytes per identity in the window); %llu lookups, "
      "%llu false positives prevented; FP %llu, FN %llu\n",
      secs, static_cast<double>(records) / secs, cpu / static_cast<double>(records) * 1e6,
      mib(filter_peak), static_cast<double>(filter_peak) * 8 / static_cast<double>(ids_per_window),
      mib(rocks_peak), mib(staged_peak), rss_peak, disk / 1048576.0,
      disk / static_cast<double>(ids_per_window), static_cast<unsigned long long>(counts.lookups),
      static_cast<unsigned long long>(counts.prevented), static_cast<unsigned long long>(fp_count),
      static_cast<unsigned long long>(fn_count));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--scale") {
      o.scale = std::strtod(next().c_str(), nullptr);
    } else if (a == "--snapshot-records") {
      o.snapshot_records = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--dir") {
      o.dir = next();
    } else if (a == "--skip-side") {
      o.side = false;
    } else if (a == "--skip-expiry") {
      o.expiry = false;
    } else if (a == "--big") {
      o.big = true;
    } else {
      std::fprintf(stderr,
                   "usage: confirm_bench [--scale X] [--snapshot-records N] [--dir DIR] "
                   "[--skip-side] [--skip-expiry] [--big]\n");
      return 2;
    }
  }
  if (o.dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    o.dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/kdedup-confirm-bench";
  }
  fs::create_directories(o.dir);
  if (o.side) side_by_side(o);
  if (o.expiry) expiry_layouts(o);
  if (o.big) big_run(o);
  fs::remove_all(o.dir);
  return 0;
}
