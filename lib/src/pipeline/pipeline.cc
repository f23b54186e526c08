// The consumer loop, worker threads, producer and delivery reports of
// `kdedup run`. See pipeline.h for the thread model; the invariants kept here:
// - a partition's records are processed by exactly one worker, in offset
//   order, and its Slice is touched only by that worker;
// - an offset is registered with its OffsetTracker before any of its outputs
//   is produced, so no delivery report can overtake the registration;
// - a revoked partition is released only after its queued records were
//   processed, their outputs delivered and the position committed;
// - a recovering partition's records before its ReplayRule's end are
//   decided but never produced, and the position handed to the committer
//   never goes below the committed offset it started from;
// - a snapshot capture is written only once a commit covers it
//   (Snapshotter), so no snapshot is ahead of the committed offset.

#include "kdedup/pipeline/pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include <fmt/format.h>

#include "kafka_errors.h"
#include "kdedup/common/kafka_log.h"
#include "kdedup/common/partitions.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/pipeline/confirm.h"
#include "kdedup/pipeline/partition_processor.h"
#include "kdedup/pipeline/provenance.h"
#include "kdedup/pipeline/reconcile.h"
#include "kdedup/pipeline/snapshotter.h"
#include "kdedup/pipeline/transaction.h"
#include "kdedup/state/snapshot_store.h"
#include "message_view.h"

namespace kdedup::pipeline {

namespace {

using Clock = std::chrono::steady_clock;
using MessagePtr = std::unique_ptr<RdKafka::Message>;

constexpr const char* kErrorHeader = "kdedup-error";
constexpr const char* kErrorMessageHeader = "kdedup-error-message";

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// "in[0-255]" (or "(none)"): a partition list that stays one short line.
std::string join_partitions(const std::vector<PartitionId>& ids) {
  std::vector<std::pair<std::string, std::int32_t>> parts;
  parts.reserve(ids.size());
  for (const auto& id : ids) parts.emplace_back(id.topic, id.partition);
  std::string out = summarize_partitions(std::move(parts));
  return out.empty() ? "(none)" : out;
}

/// Final positions for a log line: each one while there are few, else the
/// partitions as ranges and the span of the offsets (every position is in
/// the debug log).
std::string describe_positions(const std::map<PartitionId, std::int64_t>& positions) {
  constexpr std::size_t kListed = 8;
  std::string out;
  if (positions.size() <= kListed) {
    for (const auto& [id, offset] : positions) {
      out += (out.empty() ? "" : ", ") + id.str() + "@" + std::to_string(offset);
    }
    return out;
  }
  std::vector<PartitionId> ids;
  std::int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const auto& [id, offset] : positions) {
    ids.push_back(id);
    lo = std::min(lo, offset);
    hi = std::max(hi, offset);
  }
  std::string all;
  for (const auto& [id, offset] : positions) {
    all += (all.empty() ? "" : ", ") + id.str() + "@" + std::to_string(offset);
  }
  spdlog::debug("positions: {}", all);
  return fmt::format("{} partitions {} at offsets {}..{}", positions.size(), join_partitions(ids),
                     lo, hi);
}

/// Applies librdkafka properties; the error names the property.
Status apply_properties(RdKafka::Conf& conf, const config::KafkaProperties& props,
                        const char* section) {
  for (const auto& [key, value] : props) {
    std::string err;
    if (conf.set(key, value, err) != RdKafka::Conf::CONF_OK) {
      return fail(std::string(section) + " property '" + key +
                  "': " + config::kafka_property_error(key, value, err));
    }
  }
  return {};
}

/// What the first fatal problem was; later ones are only logged.
class FatalError {
 public:
  void set(std::string message) {
    std::lock_guard lock(mu_);
    if (!message_) {
      spdlog::error("{}", message);
      message_ = std::move(message);
      raised_.store(true, std::memory_order_release);
    }
  }
  [[nodiscard]] bool raised() const noexcept { return raised_.load(std::memory_order_acquire); }
  [[nodiscard]] std::string message() const {
    std::lock_guard lock(mu_);
    return message_.value_or("");
  }

 private:
  mutable std::mutex mu_;
  std::optional<std::string> message_;
  std::atomic<bool> raised_{false};
};

/// delivery: transactional: what the workers and the delivery reports tell
/// the consumer thread about the open transaction. A failed produce or
/// delivery does not stop the service in this mode: it dooms the open
/// transaction, which is aborted and redone (librdkafka would fail its
/// commit as abortable anyway). Thread-safe.
class OpenTransaction {
 public:
  /// Number of the open transaction; results of older ones are ignored.
  [[nodiscard]] std::uint64_t epoch() const noexcept {
    return epoch_.load(std::memory_order_acquire);
  }
  /// A produce or delivery of transaction `epoch` failed.
  void doom(std::uint64_t epoch, std::string reason) {
    std::lock_guard lock(mu_);
    if (epoch != epoch_.load(std::memory_order_relaxed) || reason_) return;
    spdlog::warn("{}; the open transaction will be aborted", reason);
    reason_ = std::move(reason);
  }
  [[nodiscard]] std::optional<std::string> doomed() const {
    std::lock_guard lock(mu_);
    return reason_;
  }
  void count_output() noexcept { outputs_.fetch_add(1, std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t outputs() const noexcept {
    return outputs_.load(std::memory_order_relaxed);
  }
  /// A new transaction began.
  void next() {
    std::lock_guard lock(mu_);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    reason_.reset();
    outputs_.store(0, std::memory_order_relaxed);
  }

 private:
  mutable std::mutex mu_;
  std::atomic<std::uint64_t> epoch_{0};
  std::atomic<std::uint64_t> outputs_{0};
  std::optional<std::string> reason_;
};

/// Travels with one produced record as its msg_opaque and comes back in the
/// delivery report. Holds shared ownership so a report arriving after the
/// partition was released still has somewhere to go.
/// One allocation per produced record and nothing to format: where the
/// record came from is in its provenance headers, read on failure only.
struct DeliveryTag {
  std::shared_ptr<OffsetTracker> tracker;
  std::shared_ptr<PartitionCounters> counters;
  std::int64_t offset;
  const char* destination;      // "output", "duplicates" or "dead-letter"
  std::uint64_t txn_epoch = 0;  // delivery: transactional: the transaction it belongs to
};

/// "topic[partition]@offset" of the input record an output record was
/// produced for, from its provenance headers (error messages only).
std::string source_of(RdKafka::Message& output) {
  ProvenanceHeaders found;
  std::vector<RdKafka::Headers::Header> all;
  if (const RdKafka::Headers* hs = output.headers(); hs != nullptr) all = hs->get_all();
  for (const auto& h : all) {
    found.offer(h.key(), std::string_view(static_cast<const char*>(h.value()),
                                          h.value() != nullptr ? h.value_size() : 0));
  }
  const ProvenanceParse parsed = parse_provenance(found);
  if (!parsed.provenance) return "(unknown)";
  return parsed.provenance->source.str() + "@" + std::to_string(parsed.provenance->offset);
}

class DeliveryReports final : public RdKafka::DeliveryReportCb {
 public:
  /// `txn` (null unless delivery: transactional) outlives this object.
  DeliveryReports(FatalError& fatal, OpenTransaction* txn) : fatal_(fatal), txn_(txn) {}
  void dr_cb(RdKafka::Message& message) override {
    std::unique_ptr<DeliveryTag> tag(static_cast<DeliveryTag*>(message.msg_opaque()));
    if (!tag) return;
    if (message.err() == RdKafka::ERR_NO_ERROR) {
      tag->counters->produced.fetch_add(1, std::memory_order_relaxed);
      tag->tracker->delivered(tag->offset);
      return;
    }
    if (txn_ != nullptr) {
      transactional_failure(message, *tag);
      return;
    }
    // librdkafka has already retried what was retriable (idempotent
    // producer): this failure is permanent. Never skip, never commit past.
    tag->counters->delivery_errors.fetch_add(1, std::memory_order_relaxed);
    std::string reason = "could not deliver the " + std::string(tag->destination) +
                         " record for input " + source_of(message) + " to topic '" +
                         message.topic_name() + "': " + describe_kafka_error(message.err());
    tag->tracker->failed(tag->offset, reason);
    fatal_.set(std::move(reason));
  }

 private:
  void transactional_failure(RdKafka::Message& message, DeliveryTag& tag) {
    // Records purged by our own abort_transaction() come back here too:
    // their transaction is already gone, nothing to report.
    if (message.err() == RdKafka::ERR__PURGE_QUEUE ||
        message.err() == RdKafka::ERR__PURGE_INFLIGHT) {
      return;
    }
    tag.counters->delivery_errors.fetch_add(1, std::memory_order_relaxed);
    std::string reason = "could not deliver the " + std::string(tag.destination) +
                         " record for input " + source_of(message) + " to topic '" +
                         message.topic_name() + "': " + describe_kafka_error(message.err());
    tag.tracker->failed(tag.offset, reason);
    txn_->doom(tag.txn_epoch, std::move(reason));
  }

  FatalError& fatal_;
  OpenTransaction* txn_;
};

/// Client-level events: fatal errors stop the service; the rest are logged.
/// With an event callback set, librdkafka also delivers its own log lines
/// here (from its internal threads), so they are forwarded to our log:
/// without that, `kafka.debug: cgrp,consumer` would print nothing.
class ClientEvents final : public RdKafka::EventCb {
 public:
  /// `on_statistics` (may hold an empty function) and `txn` outlive this
  /// object. `txn` is set for the producer of delivery: transactional.
  ClientEvents(FatalError& fatal, const char* client,
               const std::function<void(std::string_view)>& on_statistics,
               OpenTransaction* txn = nullptr)
      : fatal_(fatal), client_(client), on_statistics_(on_statistics), txn_(txn) {}
  void event_cb(RdKafka::Event& event) override {
    if (event.type() == RdKafka::Event::EVENT_LOG) {
      log_line(event);
      return;
    }
    if (event.type() == RdKafka::Event::EVENT_STATS) {
      if (on_statistics_) on_statistics_(event.str());
      return;
    }
    if (event.type() != RdKafka::Event::EVENT_ERROR) return;
    if (event.fatal()) {
      std::string reason = std::string(client_) +
                           " fatal error: " + describe_kafka_error(event.err()) + " (" +
                           event.str() + ")";
      if (txn_ != nullptr) {
        // The transaction loop stops the service at its next round: every
        // transactional call fails from now on, and its message names the
        // transactional.id (e.g. fenced by a newer instance).
        txn_->doom(txn_->epoch(), std::move(reason));
        return;
      }
      fatal_.set(std::move(reason));
      return;
    }
    // Transient (broker down, transport): librdkafka retries on its own.
    auto now = Clock::now();
    if (now - last_log_ < std::chrono::seconds(5) && event.err() == last_err_) return;
    last_log_ = now;
    last_err_ = event.err();
    spdlog::warn("{}: {} ({})", client_, describe_kafka_error(event.err()), event.str());
  }

 private:
  void log_line(const RdKafka::Event& event) const {
    log_librdkafka(client_, event.severity(), event.fac(), event.str());
  }

  FatalError& fatal_;
  const char* client_;
  const std::function<void(std::string_view)>& on_statistics_;
  OpenTransaction* txn_;
  Clock::time_point last_log_{};
  RdKafka::ErrorCode last_err_ = RdKafka::ERR_NO_ERROR;
};

/// Owns a librdkafka header list until the producer takes it.
struct HeadersGuard {
  rd_kafka_headers_t* headers;
  ~HeadersGuard() {
    if (headers != nullptr) rd_kafka_headers_destroy(headers);
  }
};

void add_header(rd_kafka_headers_t* headers, std::string_view name, std::string_view value) {
  rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), value.data(),
                      static_cast<ssize_t>(value.size()));
}

/// A unit of work for a worker, processed strictly in queue order.
struct Work {
  // kDrop: like kRelease but without on_release or capture: the slice holds
  // state that was never committed (delivery: transactional rollback).
  enum class Kind : std::uint8_t { kRecords, kAdopt, kBarrier, kRelease, kDrop, kCapture, kStop };
  Kind kind = Kind::kRecords;
  std::vector<MessagePtr> records;
  std::unique_ptr<Slice> slice;              // kAdopt
  std::vector<PartitionId> partitions;       // kRelease
  std::vector<PartitionId> capture;          // kRelease: snapshot these first
  std::shared_ptr<std::promise<void>> done;  // kBarrier, kRelease, kCapture
};

/// What the worker threads share (read-only after start, or thread-safe).
struct Shared {
  const config::Config& config;
  RdKafka::Producer& producer;
  FatalError& fatal;
  filter::Fingerprinter fingerprinter;
  SliceHooks& hooks;
  Snapshotter* snapshotter = nullptr;  // null: no snapshots
  OpenTransaction* txn = nullptr;      // set with delivery: transactional
  std::uint64_t salt_check = 0;        // filter::salt_check(), only with snapshots
};

/// One worker thread and its queue. The queue is the only thing shared with
/// the consumer thread; the slices are the worker's alone.
class Worker {
 public:
  Worker(std::uint32_t index, Shared& shared, identity::IdentityExtractor extractor)
      : index_(index),
        shared_(shared),
        processor_(ProcessorOptions::of(shared.config), std::move(extractor),
                   shared.fingerprinter) {}

  void start() {
    thread_ = std::thread([this] { loop(); });
  }

  void join() {
    if (thread_.joinable()) thread_.join();
  }

  /// Consumer thread: enqueue work.
  void push(Work work) {
    if (work.kind == Work::Kind::kRecords) {
      queued_records_.fetch_add(work.records.size(), std::memory_order_relaxed);
    }
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(work));
    }
    cv_.notify_one();
  }

  /// Consumer thread: returns once everything queued before has been processed.
  void barrier(Work::Kind kind = Work::Kind::kBarrier, std::vector<PartitionId> partitions = {},
               std::vector<PartitionId> capture = {}) {
    Work w;
    w.kind = kind;
    w.partitions = std::move(partitions);
    w.capture = std::move(capture);
    w.done = std::make_shared<std::promise<void>>();
    auto fut = w.done->get_future();
    push(std::move(w));
    fut.wait();
  }

  [[nodiscard]] std::size_t queued_records() const noexcept {
    return queued_records_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t busy_nanos() const noexcept {
    return busy_nanos_.load(std::memory_order_relaxed);
  }

 private:
  void loop() {
    // How often an idle worker looks for slices whose snapshot came due
    // without new records (a partition that went quiet after a burst).
    constexpr auto kIdleCheck = std::chrono::milliseconds(250);
    for (;;) {
      Work work;
      {
        std::unique_lock lock(mu_);
        if (!cv_.wait_for(lock, kIdleCheck, [&] { return !queue_.empty(); })) {
          lock.unlock();
          if (!failed_) {
            for (auto& [id, slice] : slices_) {
              if (slice->captures().records_since > 0) maybe_capture(*slice, 0);
            }
          }
          continue;
        }
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      switch (work.kind) {
        case Work::Kind::kRecords: {
          auto started = Clock::now();
          if (!failed_) process(work.records);
          queued_records_.fetch_sub(work.records.size(), std::memory_order_relaxed);
          busy_nanos_.fetch_add(static_cast<std::uint64_t>((Clock::now() - started).count()),
                                std::memory_order_relaxed);
          break;
        }
        case Work::Kind::kAdopt: {
          PartitionId id = work.slice->id();
          slices_[id] = std::move(work.slice);
          break;
        }
        case Work::Kind::kRelease:
        case Work::Kind::kDrop:
          for (const auto& id : work.partitions) {
            auto it = slices_.find(id);
            if (it == slices_.end()) continue;
            if (work.kind == Work::Kind::kRelease) {
              // The final snapshot, at the final stored position: librdkafka
              // commits it once the rebalance callback returned, and the
              // commit result releases the capture to the store.
              if (std::find(work.capture.begin(), work.capture.end(), id) != work.capture.end()) {
                capture(*it->second);
              }
              if (shared_.hooks.on_release) shared_.hooks.on_release(*it->second);
            }
            slices_.erase(it);
          }
          work.done->set_value();
          break;
        case Work::Kind::kCapture:
          for (auto& [id, slice] : slices_) capture(*slice);
          work.done->set_value();
          break;
        case Work::Kind::kBarrier:
          work.done->set_value();
          break;
        case Work::Kind::kStop:
          for (auto& [name, rkt] : topics_) rd_kafka_topic_destroy(rkt);
          topics_.clear();
          return;
      }
    }
  }

  /// Processes one batch: records are grouped by partition (keeping each
  /// partition's order) and each group goes through its Slice.
  void process(std::vector<MessagePtr>& records) {
    std::size_t begin = 0;
    while (begin < records.size()) {
      // Consecutive records of one partition form a group; the consumer hands
      // out records per partition in runs, so groups are usually long.
      const auto& first = *records[begin];
      std::size_t end = begin + 1;
      // Same topic = same topic handle: no name copies per record.
      const rd_kafka_message_t* head = records[begin]->c_ptr();
      while (end < records.size() && records[end]->c_ptr()->partition == head->partition &&
             records[end]->c_ptr()->rkt == head->rkt) {
        ++end;
      }
      PartitionId id{first.topic_name(), first.partition()};
      auto it = slices_.find(id);
      if (it == slices_.end()) {
        // Revoked between fetch and processing: not committed, so the new
        // owner reads it again.
        spdlog::debug("worker {}: skipping {} records of unowned partition {}", index_, end - begin,
                      id.str());
      } else {
        process_partition(*it->second, std::span(records).subspan(begin, end - begin));
        it->second->counters()->queued.fetch_sub(static_cast<std::int64_t>(end - begin),
                                                 std::memory_order_relaxed);
        if (failed_) return;
        maybe_capture(*it->second, end - begin);
      }
      begin = end;
    }
  }

  /// Takes a snapshot capture of `slice` at its current position when one
  /// is due (state.snapshot_interval or snapshot_records since the last) and
  /// none of that partition is waiting or being written.
  void maybe_capture(Slice& slice, std::size_t records) {
    if (shared_.snapshotter == nullptr || slice.filter() == nullptr) return;
    auto& schedule = slice.captures();
    schedule.records_since += records;
    const auto& state = shared_.config.state;
    if (schedule.records_since < state.snapshot_records &&
        Clock::now() - schedule.last_time < state.snapshot_interval) {
      return;
    }
    if (shared_.snapshotter->busy(slice.id())) return;
    capture(slice);
  }

  /// Copies the slice's state into a capture for the Snapshotter (the only
  /// snapshot work on the worker: one serialization of the filter). Skipped
  /// when nothing changed since the last capture.
  void capture(Slice& slice) {
    if (shared_.snapshotter == nullptr || slice.filter() == nullptr) return;
    auto& schedule = slice.captures();
    const std::int64_t next = slice.next_offset();
    schedule.records_since = 0;
    schedule.last_time = Clock::now();
    if (next < 0 || next == schedule.last_offset) return;
    schedule.last_offset = next;
    // serialize() of the AuditedFilter is the inner filter's state.
    state::SnapshotCapture c = state::capture_snapshot(
        state::PartitionKey{slice.id().topic, slice.id().partition}, *slice.filter(), slice.scale(),
        next, slice.clock().now_ms(), shared_.salt_check);
    spdlog::debug("captured {} at offset {} ({} bytes in {:.3f} ms)", slice.id().str(), next,
                  c.state.size(), static_cast<double>(c.capture_time.count()) / 1e6);
    shared_.snapshotter->offer(std::move(c));
  }

  /// The producer as the processor's sinks, for one batch of one partition.
  class ProducerSinks final : public RecordSinks {
   public:
    ProducerSinks(Worker& worker, Slice& slice, std::span<MessagePtr> records)
        : worker_(worker), slice_(slice), records_(records) {}
    void output(std::size_t i) override {
      const auto& cfg = worker_.shared_.config;
      const std::int32_t partition = cfg.output.partitioning == config::Partitioning::kInput
                                         ? records_[i]->partition()
                                         : RdKafka::Topic::PARTITION_UA;
      if (worker_.produce(slice_, *records_[i], cfg.output.topic, partition, "output", nullptr)) {
        worker_.observe_emit_age(*records_[i]);
      }
    }
    void duplicate(std::size_t i) override {
      worker_.produce(slice_, *records_[i], worker_.shared_.config.duplicates_topic,
                      RdKafka::Topic::PARTITION_UA, "duplicates", nullptr);
    }
    void dead_letter(std::size_t i, const identity::ExtractError& error) override {
      worker_.produce(slice_, *records_[i], worker_.shared_.config.dlq_topic,
                      RdKafka::Topic::PARTITION_UA, "dead-letter", &error);
    }
    bool stopped() const override { return worker_.shared_.fatal.raised(); }

   private:
    Worker& worker_;
    Slice& slice_;
    std::span<MessagePtr> records_;
  };

  void process_partition(Slice& slice, std::span<MessagePtr> records) {
    auto started = Clock::now();
    auto& counters = *slice.counters();
    emit_ages_ = {};
    ProducerSinks sinks(*this, slice, records);
    const BatchResult r = processor_.process(slice, batch_view_.of(records), wall_ms(), sinks);
    if (r.offsets_rejected) {
      shared_.fatal.set("internal error: offsets of " + slice.id().str() +
                        " went backwards; stopping without committing them");
      failed_ = true;
      return;
    }
    if (r.fail_message) {
      failed_ = true;
      shared_.fatal.set(*r.fail_message);
    }
    publish_filter_stats(slice);
    // Latency histograms: a handful of relaxed adds per batch, never per
    // record (the StatsBridge turns them into Prometheus observations).
    counters.emit_ages.add(emit_ages_);
    counters.batch_times.observe(static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count()));
  }

  /// The filter's size and fpp estimate into the partition's counters, at
  /// most once a second per partition (stats() walks the sub-filters).
  void publish_filter_stats(Slice& slice) {
    const auto* f = slice.filter();
    if (f == nullptr) return;
    auto& schedule = slice.captures();
    const auto now = Clock::now();
    if (now - schedule.last_stats < std::chrono::seconds(1)) return;
    schedule.last_stats = now;
    auto& counters = *slice.counters();
    const auto fs = f->stats();
    counters.filter_bytes.store(fs.bytes, std::memory_order_relaxed);
    counters.filter_subfilters.store(fs.subfilters, std::memory_order_relaxed);
    counters.filter_fpp_estimate.store(fs.fpp_estimate, std::memory_order_relaxed);
  }

  /// Adds the age at emit of an output record just handed to the producer
  /// (wall clock now minus its timestamp) to this batch's counts. Records
  /// without a usable timestamp leave with the production time and are not
  /// observed; a timestamp in the future counts as age 0.
  void observe_emit_age(const RdKafka::Message& m) noexcept {
    const auto ts = m.timestamp();
    if (ts.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE || ts.timestamp <= 0) {
      return;
    }
    const std::int64_t now_ns = wall_ns();
    // Compared in milliseconds first so a far-future timestamp cannot
    // overflow the conversion to nanoseconds.
    const std::int64_t age_ns =
        ts.timestamp > now_ns / 1'000'000 ? 0 : now_ns - ts.timestamp * 1'000'000;
    emit_ages_.observe(static_cast<std::uint64_t>(age_ns));
  }

  /// Produces a copy of `m` (key, value, headers, timestamp) plus provenance
  /// headers, and for dead letters the error headers. False when the
  /// producer refused it (the fatal error is raised; delivery: transactional
  /// dooms the open transaction instead).
  bool produce(Slice& slice, RdKafka::Message& m, const std::string& topic, std::int32_t partition,
               const char* destination, const identity::ExtractError* error) {
    // librdkafka's C API: the input's headers copied in one call, the
    // provenance added without building strings, and the topic by handle
    // (by name, every record is a locked lookup).
    const rd_kafka_message_t* in = m.c_ptr();
    rd_kafka_headers_t* input_headers = nullptr;
    rd_kafka_headers_t* headers =
        rd_kafka_message_headers(in, &input_headers) == RD_KAFKA_RESP_ERR_NO_ERROR
            ? rd_kafka_headers_copy(input_headers)
            : rd_kafka_headers_new(error != nullptr ? 5 : 3);
    HeadersGuard owned_headers{headers};
    const fmt::format_int offset_text(in->offset);
    const fmt::format_int partition_text(in->partition);
    add_header(headers, kProvenanceTopicHeader, rd_kafka_topic_name(in->rkt));
    add_header(headers, kProvenancePartitionHeader, partition_text.c_str());
    add_header(headers, kProvenanceOffsetHeader, offset_text.c_str());
    if (error != nullptr) {
      add_header(headers, kErrorHeader, identity::to_string(error->reason));
      add_header(headers, kErrorMessageHeader, error->message);
    }
    // Timestamps <= 0 cannot be produced as such (0 asks the producer for
    // "now"); they leave with the time of production.
    rd_kafka_timestamp_type_t ts_type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    const std::int64_t ts = rd_kafka_message_timestamp(in, &ts_type);
    const std::int64_t out_ts = ts_type != RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && ts > 0 ? ts : 0;
    auto tag = std::make_unique<DeliveryTag>(
        DeliveryTag{slice.tracker(), slice.counters(), in->offset, destination,
                    shared_.txn != nullptr ? shared_.txn->epoch() : 0});
    rd_kafka_topic_t* rkt = topic_handle(topic);
    const std::size_t key_len = in->key != nullptr ? in->key_len : 0;
    for (;;) {
      const auto err =
          rkt == nullptr
              ? RdKafka::ERR__UNKNOWN_TOPIC
              : static_cast<RdKafka::ErrorCode>(rd_kafka_producev(
                    shared_.producer.c_ptr(), RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(partition),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_VALUE(in->payload, in->len), RD_KAFKA_V_KEY(in->key, key_len),
                    RD_KAFKA_V_TIMESTAMP(out_ts), RD_KAFKA_V_HEADERS(headers),
                    RD_KAFKA_V_OPAQUE(tag.get()), RD_KAFKA_V_END));
      if (err == RdKafka::ERR_NO_ERROR) {
        owned_headers.headers = nullptr;  // librdkafka owns them now
        tag.release();                    // comes back in the delivery report
        if (shared_.txn != nullptr && error == nullptr && topic == shared_.config.output.topic) {
          shared_.txn->count_output();
        }
        return true;
      }
      if (err == RdKafka::ERR__QUEUE_FULL && !shared_.fatal.raised()) {
        // The delivery thread drains the queue; wait for room.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::string reason = "could not produce the " + std::string(destination) +
                           " record for input " + slice.id().str() + "@" + offset_text.str() +
                           " to topic '" + topic + "': " + describe_kafka_error(err);
      slice.counters()->delivery_errors.fetch_add(1, std::memory_order_relaxed);
      slice.tracker()->failed(m.offset(), reason);
      if (shared_.txn != nullptr) {
        // The transaction is redone from its start; this worker goes on.
        shared_.txn->doom(tag->txn_epoch, std::move(reason));
        return false;
      }
      shared_.fatal.set(std::move(reason));
      failed_ = true;
      return false;
    }
  }

  std::uint32_t index_;
  Shared& shared_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> queue_;
  std::atomic<std::size_t> queued_records_{0};
  std::atomic<std::uint64_t> busy_nanos_{0};
  bool failed_ = false;  // stop processing after a fatal record-level error

  /// The producer's handle of a destination topic, made on first use (a
  /// handful per worker: output, duplicates, dead letters).
  rd_kafka_topic_t* topic_handle(const std::string& name) {
    for (const auto& [n, rkt] : topics_) {
      if (n == name) return rkt;
    }
    rd_kafka_topic_t* rkt = rd_kafka_topic_new(shared_.producer.c_ptr(), name.c_str(), nullptr);
    if (rkt != nullptr) topics_.emplace_back(name, rkt);
    return rkt;  // null: an invalid name, reported by produce()
  }

  // Worker-thread state, only touched by loop().
  std::vector<std::pair<std::string, rd_kafka_topic_t*>> topics_;  // released at kStop
  std::map<PartitionId, std::unique_ptr<Slice>> slices_;
  PartitionProcessor processor_;
  BatchView batch_view_;
  metrics::EmitAgeCounts emit_ages_;  // this batch's output records
};

}  // namespace

namespace {

bool plan_restores(const RecoveryPlan& plan) {
  return plan.filter == RecoveryPlan::FilterSource::kRestored;
}

/// Inserts deliveries found only in the output into a new slice's filter,
/// oldest first (the filter's clock only moves forward); returns how many.
std::size_t learn_in_tick_order(Slice& slice,
                                std::vector<std::pair<filter::Tick, filter::Fingerprint>>& found) {
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<filter::Fingerprint> fps;
  std::vector<filter::Tick> ticks;
  for (const auto& [tick, fp] : found) {
    ticks.push_back(tick);
    fps.push_back(fp);
  }
  std::vector<filter::Decision> out(fps.size());
  const std::vector<std::uint8_t> learn(fps.size(), 1);
  slice.decide(fps, ticks, out, learn);
  return fps.size();
}

}  // namespace

/// The consumer thread's view of one assigned partition.
struct Assigned {
  std::uint32_t worker = 0;
  std::shared_ptr<OffsetTracker> tracker;
  std::shared_ptr<PartitionCounters> counters;
  std::int64_t committed = -1;  // last offset the group coordinator confirmed
  // Last position handed to the client's committer; starts at the committed
  // offset, so replayed records (below it) are never stored again.
  std::int64_t stored = -1;
  // Recovery: restoring until the partition's position reaches restore_end
  // (the plan's rebuild_until, capped at the high watermark seen then).
  bool restoring = false;
  std::int64_t restore_end = 0;
  Clock::time_point assigned_at{};
  RecoveryOutcome outcome;
  // delivery: transactional: first offset handed to the worker since the
  // partition was assigned or rolled back (-1 = none yet): where a rollback
  // returns to when the partition has no committed offset at all.
  std::int64_t start_offset = -1;
};

struct Pipeline::Impl final : public RdKafka::RebalanceCb,
                              public RdKafka::OffsetCommitCb,
                              public TxnHost {
  config::Config config;
  SliceHooks hooks;
  SliceOptions options;
  FatalError fatal;
  OpenTransaction open_txn;  // delivery: transactional only
  DeliveryReports reports{
      fatal, config.delivery == config::Delivery::kTransactional ? &open_txn : nullptr};
  ClientEvents producer_events{
      fatal, "producer", hooks.on_statistics,
      config.delivery == config::Delivery::kTransactional ? &open_txn : nullptr};
  ClientEvents consumer_events{fatal, "consumer", hooks.on_statistics};
  std::unique_ptr<RdKafka::Producer> producer;
  std::unique_ptr<RdKafka::KafkaConsumer> consumer;
  std::unique_ptr<Shared> shared;
  // The consumer thread's extractor: recovery learns identities from output
  // records whose input was deleted by retention.
  std::optional<identity::IdentityExtractor> recovery_extractor;
  state::SnapshotStore* store = nullptr;     // null: no snapshots
  std::unique_ptr<Snapshotter> snapshotter;  // set when store is
  std::int32_t output_partitions = -1;       // from check_topics(); -1 = ask on first use
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::uint32_t> slices_per_worker;

  // Consumer-thread state. `assigned` is also read by stats() under
  // registry_mu; the consumer thread writes it only under that lock.
  mutable std::mutex registry_mu;
  std::map<PartitionId, Assigned> assigned;
  std::atomic<std::uint64_t> rebalances{0};
  std::atomic<bool> ready{false};
  // Consumer-loop heartbeat: steady-clock nanoseconds of the loop's last
  // turn, -1 before run() starts it (see PipelineStats::consumer_loop_age_ms).
  std::atomic<std::int64_t> loop_beat_ns{-1};
  void beat_loop() noexcept { loop_beat_ns.store(steady_ns(), std::memory_order_relaxed); }
  std::vector<std::vector<MessagePtr>> pending;  // per worker, not yet pushed
  Clock::time_point first_pending{};

  std::thread delivery_thread;
  std::atomic<bool> delivery_stop{false};

  // Consumer-thread state for the commit protocol (see store_offsets()).
  std::map<PartitionId, std::int64_t> confirmed;  // every coordinator-confirmed commit
  bool joined_once = false;  // an assignment arrived once (a SyncGroup succeeded)
  // How long a member that is stopped before its first join completed waits
  // for it: a join takes at most about a session timeout.
  std::chrono::milliseconds first_join_wait{50'000};
  bool shutting_down = false;

  bool ran = false;
  bool closed = false;
  bool threads_stopped = false;

  // delivery: transactional (see the "delivery: transactional" section
  // below): the transactional producer replaces `producer`; the TxnLoop runs
  // one transaction per commit_interval on the consumer thread.
  std::unique_ptr<TransactionalProducer> txn_producer;
  std::unique_ptr<ProducerTxnCalls> txn_calls;
  std::unique_ptr<TxnLoop> txn_loop;
  [[nodiscard]] bool transactional() const noexcept {
    return config.delivery == config::Delivery::kTransactional;
  }
  /// The producer the workers produce with (either mode).
  [[nodiscard]] RdKafka::Producer& output_producer() {
    return txn_producer ? txn_producer->producer() : *producer;
  }

  explicit Impl(const config::Config& c, SliceHooks h, state::SnapshotStore* s)
      : config(c), hooks(std::move(h)), options(slice_options(c)), store(s) {}

  ~Impl() override {
    // Leave the group before the workers go away (close() may call back).
    if (consumer && !closed) consumer->close();
    stop_threads();
    // Writes still queued call back into the Snapshotter: finish them first.
    if (store != nullptr) store->drain();
  }

  Status build_clients();
  Status check_topics();
  Status run(const std::atomic<bool>& stop);
  void rebalance_cb(RdKafka::KafkaConsumer* c, RdKafka::ErrorCode err,
                    std::vector<RdKafka::TopicPartition*>& partitions) override;
  void offset_commit_cb(RdKafka::ErrorCode err,
                        std::vector<RdKafka::TopicPartition*>& offsets) override;
  void assign(std::vector<RdKafka::TopicPartition*>& partitions);
  void revoke(std::vector<RdKafka::TopicPartition*>& partitions);
  [[nodiscard]] Result<std::map<PartitionId, std::int64_t>> recover(
      const std::vector<PartitionId>& ids,
      const std::map<PartitionId, std::int64_t>& known_committed = {});
  void check_restored();
  void finish_recovery(const PartitionId& id, Assigned& a);
  void on_committed(const PartitionId& id, std::int64_t offset);
  void on_snapshot_written(const PartitionId& id, const Result<state::WriteReport>& result);
  [[nodiscard]] ReconcileOptions reader_options() const;
  void dispatch(MessagePtr message);
  void flush_pending();
  [[nodiscard]] std::size_t queued_records() const;
  void wait_delivered(const std::vector<PartitionId>& ids, Clock::time_point deadline);
  void store_offsets(const std::vector<PartitionId>& ids);
  [[nodiscard]] bool all_stored_confirmed() const;
  void drain_until(Clock::time_point deadline, const std::function<bool()>& done);
  [[nodiscard]] std::vector<PartitionId> assigned_ids() const;
  void stop_threads();

  // delivery: transactional.
  Status build_transactional_producer(const config::KafkaProperties& producer_props,
                                      const config::KafkaProperties& consumer_props);
  Status start_transactions();
  void transaction_round();
  void handle_round(const TxnLoop::Round& round);
  [[nodiscard]] bool revoke_transactional(const std::vector<PartitionId>& ids, bool lost,
                                          std::vector<PartitionId>& capture);
  void finish_transactions();
  void log_transaction_totals() const;
  // TxnHost
  [[nodiscard]] bool settle() override;
  [[nodiscard]] std::vector<TxnOffset> positions() override;
  [[nodiscard]] std::uint64_t open_outputs() override { return open_txn.outputs(); }
  [[nodiscard]] std::optional<std::string> abort_reason() override { return open_txn.doomed(); }
  void began() override { open_txn.next(); }
  void committed(const std::vector<TxnOffset>& offsets) override;
  [[nodiscard]] Status roll_back(const std::vector<TxnRollback>& partitions) override;
};

SliceOptions slice_options(const config::Config& config) {
  SliceOptions o;
  o.window_ms = config.window_ms();
  o.max_future_skew_ms = config.max_future_skew.count();
  o.filter_enabled = config.filter_enabled;
  o.refresh = config.on_duplicate == config::OnDuplicate::kRefresh;
  o.filter = config.filter;
  o.memory = make_memory_budget(config);
  return o;
}

Status Pipeline::Impl::build_clients() {
  std::string err;

  // Producer: kdedup's defaults, then the user's, then the forced keys.
  std::unique_ptr<RdKafka::Conf> pconf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  config::KafkaProperties pprops{{"linger.ms", "5"}, {"message.max.bytes", "16777216"}};
  // Statistics feed consumer lag and producer queue metrics; a user's
  // statistics.interval.ms (kafka / consumer / producer) wins.
  constexpr const char* kStatisticsEveryMs = "5000";
  if (hooks.on_statistics) pprops["statistics.interval.ms"] = kStatisticsEveryMs;
  for (auto& [k, v] : config::producer_properties(config)) pprops[k] = v;
  pprops["enable.idempotence"] = "true";
  if (!transactional()) {
    if (auto s = apply_properties(*pconf, pprops, "producer"); !s) return s;
    if (pconf->set("dr_cb", &reports, err) != RdKafka::Conf::CONF_OK ||
        pconf->set("event_cb", &producer_events, err) != RdKafka::Conf::CONF_OK) {
      return fail("producer: " + err);
    }
    producer.reset(RdKafka::Producer::create(pconf.get(), err));
    if (!producer) return fail("cannot create the Kafka producer: " + err);
  } else if (auto s = build_transactional_producer(pprops, config::consumer_properties(config));
             !s) {
    return s;
  }

  std::unique_ptr<RdKafka::Conf> cconf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  // Without a committed offset, start from the beginning: a dedup service
  // should not skip records that were already waiting.
  config::KafkaProperties cprops{{"auto.offset.reset", "earliest"}};
  if (hooks.on_statistics) cprops["statistics.interval.ms"] = kStatisticsEveryMs;
  for (auto& [k, v] : config::consumer_properties(config)) cprops[k] = v;
  cprops["group.id"] = config.group_id;
  // Commits: the pipeline only *stores* positions whose outputs were all
  // delivered (store_offsets()); librdkafka's own committer sends them. It
  // commits only while the group is stable, and commits a revoked
  // partition's stored position before it rejoins, i.e. before the partition
  // can go to another member. An application-timed commitSync cannot know
  // that a rejoin is pending: see store_offsets() for what that breaks.
  // delivery: transactional commits nothing through the consumer: the
  // offsets travel in the transaction (send_offsets_to_transaction).
  if (!transactional()) {
    cprops["enable.auto.commit"] = "true";
    cprops["auto.commit.interval.ms"] =
        std::to_string(std::max<std::int64_t>(1, config.commit_interval.count()));
  }
  cprops["enable.auto.offset.store"] = "false";
  if (auto s = apply_properties(*cconf, cprops, "consumer"); !s) return s;
  if (std::string session; cconf->get("session.timeout.ms", session) == RdKafka::Conf::CONF_OK) {
    first_join_wait = std::chrono::milliseconds(std::stoll(session) + 5'000);
  }
  if (cconf->set("rebalance_cb", static_cast<RdKafka::RebalanceCb*>(this), err) !=
          RdKafka::Conf::CONF_OK ||
      cconf->set("offset_commit_cb", static_cast<RdKafka::OffsetCommitCb*>(this), err) !=
          RdKafka::Conf::CONF_OK ||
      cconf->set("event_cb", &consumer_events, err) != RdKafka::Conf::CONF_OK) {
    return fail("consumer: " + err);
  }
  consumer.reset(RdKafka::KafkaConsumer::create(cconf.get(), err));
  if (!consumer) return fail("cannot create the Kafka consumer: " + err);

  shared = std::make_unique<Shared>(
      Shared{config, output_producer(), fatal, filter::Fingerprinter(config.identity.salt), hooks});
  if (transactional()) shared->txn = &open_txn;
  if (store != nullptr && config.filter_enabled) {
    // Slow on purpose (Argon2id): once per process, not per snapshot.
    const auto t0 = Clock::now();
    auto check = filter::salt_check(config.identity.salt);
    if (!check) return fail("state.dir: " + check.error().message);
    shared->salt_check = *check;
    spdlog::debug("salt check value for snapshots derived in {} ms",
                  std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
  }
  const std::uint32_t threads = std::max<std::uint32_t>(1, config.threads);
  for (std::uint32_t i = 0; i < threads; ++i) {
    auto extractor = identity::IdentityExtractor::create(config.identity.extractor);
    if (extractor && !recovery_extractor) {
      recovery_extractor = identity::IdentityExtractor::create(config.identity.extractor).value();
    }
    if (!extractor) return fail("identity.extractor: " + extractor.error().message);
    workers.push_back(std::make_unique<Worker>(i, *shared, std::move(*extractor)));
  }
  slices_per_worker.assign(threads, 0);
  pending.resize(threads);
  if (store != nullptr && config.filter_enabled) {
    snapshotter = std::make_unique<Snapshotter>(
        [s = store](state::SnapshotCapture c, Snapshotter::Done done) {
          s->submit(std::move(c), std::move(done));
        },
        [this](const PartitionId& id, const Result<state::WriteReport>& r) {
          on_snapshot_written(id, r);
        });
    shared->snapshotter = snapshotter.get();
  }
  if (transactional()) {
    txn_calls = std::make_unique<ProducerTxnCalls>(*txn_producer, *consumer);
    txn_loop = std::make_unique<TxnLoop>(*txn_calls, *this);
  }
  return {};
}

Status Pipeline::Impl::check_topics() {
  std::map<std::string, int> partitions;  // topic -> count
  // One metadata request for all topics: asking for a named topic would
  // auto-create it on clusters that allow that.
  RdKafka::Metadata* raw = nullptr;
  RdKafka::ErrorCode md_err = consumer->metadata(true, nullptr, &raw, 10'000);
  std::unique_ptr<RdKafka::Metadata> md(raw);
  if (md_err != RdKafka::ERR_NO_ERROR) {
    return fail("cannot read the cluster metadata: " + describe_kafka_error(md_err));
  }
  auto lookup = [&](const std::string& topic) -> Result<int> {
    for (const auto* t : *md->topics()) {
      if (t->topic() != topic) continue;
      if (t->err() != RdKafka::ERR_NO_ERROR) {
        return fail("topic '" + topic + "': " + describe_kafka_error(t->err()));
      }
      return static_cast<int>(t->partitions()->size());
    }
    return fail("topic '" + topic + "' does not exist; create it (or fix the name)");
  };
  std::vector<std::string> errors;
  int max_input = 0;
  std::string widest;
  for (const auto& topic : config.input.topics) {
    auto n = lookup(topic);
    if (!n) {
      errors.push_back("input.topics: " + n.error().message);
      continue;
    }
    if (*n > max_input) {
      max_input = *n;
      widest = topic;
    }
    spdlog::info("input topic '{}': {} partitions", topic, *n);
  }
  auto out = lookup(config.output.topic);
  if (out) output_partitions = *out;
  if (!out) {
    errors.push_back("output.topic: " + out.error().message);
  } else if (config.output.partitioning == config::Partitioning::kInput && *out < max_input) {
    errors.push_back("output.topic: '" + config.output.topic + "' has " + std::to_string(*out) +
                     " partitions but input topic '" + widest + "' has " +
                     std::to_string(max_input) +
                     "; with output.partitioning: input every input partition needs the output "
                     "partition of the same number. Add partitions to the output topic or set "
                     "output.partitioning: key");
  }
  if (config.on_invalid == config::OnInvalid::kDlq) {
    if (auto d = lookup(config.dlq_topic); !d) errors.push_back("dlq_topic: " + d.error().message);
  }
  if (!config.duplicates_topic.empty()) {
    if (auto d = lookup(config.duplicates_topic); !d) {
      errors.push_back("duplicates_topic: " + d.error().message);
    }
  }
  if (errors.empty()) return {};
  std::string joined;
  for (const auto& e : errors) joined += (joined.empty() ? "" : "\n") + e;
  return fail(joined);
}

void Pipeline::Impl::dispatch(MessagePtr message) {
  PartitionId id{message->topic_name(), message->partition()};
  auto it = assigned.find(id);
  if (it == assigned.end()) return;  // not ours (any more): not committed, re-read by the owner
  if (it->second.start_offset < 0) it->second.start_offset = message->offset();
  it->second.counters->queued.fetch_add(1, std::memory_order_relaxed);
  auto& batch = pending[it->second.worker];
  if (batch.empty() &&
      std::all_of(pending.begin(), pending.end(), [](const auto& p) { return p.empty(); })) {
    first_pending = Clock::now();
  }
  batch.push_back(std::move(message));
  if (batch.size() >= config.batch_size) {
    Work w;
    w.records = std::move(batch);
    batch.clear();
    workers[it->second.worker]->push(std::move(w));
  }
}

void Pipeline::Impl::flush_pending() {
  for (std::size_t i = 0; i < pending.size(); ++i) {
    if (pending[i].empty()) continue;
    Work w;
    w.records = std::move(pending[i]);
    pending[i].clear();
    workers[i]->push(std::move(w));
  }
}

std::size_t Pipeline::Impl::queued_records() const {
  std::size_t total = 0;
  for (const auto& w : workers) total += w->queued_records();
  return total;
}

std::vector<PartitionId> Pipeline::Impl::assigned_ids() const {
  std::vector<PartitionId> ids;
  for (const auto& [id, a] : assigned) ids.push_back(id);
  return ids;
}

void Pipeline::Impl::wait_delivered(const std::vector<PartitionId>& ids,
                                    Clock::time_point deadline) {
  for (;;) {
    std::uint64_t in_flight = 0;
    for (const auto& id : ids) {
      if (auto it = assigned.find(id); it != assigned.end()) {
        in_flight += it->second.tracker->in_flight();
      }
    }
    if (in_flight == 0) return;
    if (Clock::now() >= deadline) {
      spdlog::warn(
          "{} outputs still undelivered after shutdown_timeout; their input offsets "
          "stay uncommitted and will be read again",
          in_flight);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Why the pipeline stores offsets instead of committing them itself.
//
// It used to call commitSync() every commit_interval from the consumer
// thread. When another member joins, the coordinator answers our heartbeat
// with REBALANCE_IN_PROGRESS and librdkafka sends a JoinGroup, which the
// coordinator parks until the group's join phase ends (the test broker waits
// session.timeout.ms - 1000 ms; a real broker waits for every member). A
// broker serves one request per connection at a time, so an OffsetCommit sent
// meanwhile waits behind the JoinGroup and is judged after the new generation
// exists: ILLEGAL_GENERATION. librdkafka 2.0.2 takes that answer as "our
// assignment is lost": it revokes everything as lost (nothing gets
// committed), resets its generation, and its SyncGroup for the new generation
// then fails too, which aborts the round for every member. With a commit due
// every 200 ms one always landed in the 5 s join phase, so the joining member
// only ever got "assigned 0 partition(s)" and the first member kept losing
// its partitions (`debug: cgrp` shows "OffsetCommit ... in join-state
// wait-join", then "(lost): OffsetCommit error: Illegal generation").
// librdkafka's own committer only commits in the steady state, and on
// revocation commits the revoked partitions' stored positions and waits for
// the answer before it rejoins. So the pipeline decides *what* may be
// committed (OffsetTracker::committable(), every output delivered) and
// librdkafka decides *when*.
void Pipeline::Impl::store_offsets(const std::vector<PartitionId>& ids) {
  std::vector<RdKafka::TopicPartition*> offsets;
  std::vector<std::pair<Assigned*, std::int64_t>> updates;
  for (const auto& id : ids) {
    auto it = assigned.find(id);
    if (it == assigned.end()) continue;
    auto pos = it->second.tracker->committable();
    if (!pos || *pos <= it->second.stored) continue;
    offsets.push_back(RdKafka::TopicPartition::create(id.topic, id.partition, *pos));
    updates.emplace_back(&it->second, *pos);
  }
  if (offsets.empty()) return;
  RdKafka::ErrorCode err = consumer->offsets_store(offsets);
  std::map<std::string, std::map<PartitionId, std::int64_t>> failed;  // by reason
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    auto* tp = offsets[i];
    if (err == RdKafka::ERR_NO_ERROR && tp->err() == RdKafka::ERR_NO_ERROR) {
      updates[i].first->stored = updates[i].second;
    } else {
      failed[describe_kafka_error(err != RdKafka::ERR_NO_ERROR ? err : tp->err())]
            [PartitionId{tp->topic(), tp->partition()}] = updates[i].second;
    }
  }
  for (const auto& [reason, positions] : failed) {
    spdlog::warn("cannot hand {} to the committer: {}; it will be retried",
                 describe_positions(positions), reason);
  }
  RdKafka::TopicPartition::destroy(offsets);
}

void Pipeline::Impl::offset_commit_cb(RdKafka::ErrorCode err,
                                      std::vector<RdKafka::TopicPartition*>& offsets) {
  if (err == RdKafka::ERR__NO_OFFSET) return;  // nothing new to commit
  std::map<PartitionId, std::int64_t> released;
  std::map<std::string, std::map<PartitionId, std::int64_t>> failed;  // by reason
  for (auto* tp : offsets) {
    PartitionId id{tp->topic(), tp->partition()};
    const RdKafka::ErrorCode e = err != RdKafka::ERR_NO_ERROR ? err : tp->err();
    if (e == RdKafka::ERR_REBALANCE_IN_PROGRESS) {
      // Sent just before the group started a rebalance: the position stays
      // stored and the committer sends it again once the group is stable.
      spdlog::debug("commit of {} at offset {} deferred: group is rebalancing", id.str(),
                    tp->offset());
      continue;
    }
    if (e != RdKafka::ERR_NO_ERROR) {
      failed[describe_kafka_error(e)][id] = tp->offset();
      // A released partition's final capture waited for this commit.
      if (snapshotter && !assigned.count(id)) snapshotter->drop(id);
      continue;
    }
    if (tp->offset() < 0) continue;
    on_committed(id, tp->offset());
    auto it = assigned.find(id);
    // Final commits (of partitions already handed back, or at shutdown) are
    // what an operator checks after a rebalance; the periodic ones are noise.
    if (it == assigned.end() || shutting_down) released[id] = tp->offset();
  }
  for (const auto& [reason, positions] : failed) {
    spdlog::warn("commit of {} failed: {}; records after the last commit will be read again",
                 describe_positions(positions), reason);
  }
  if (!released.empty()) spdlog::info("committed {}", describe_positions(released));
}

// The one place that learns "offset X of partition P is committed": the
// commit callback calls it (idempotent mode); a transaction commit calls it
// for the offsets it carried.
void Pipeline::Impl::on_committed(const PartitionId& id, std::int64_t offset) {
  confirmed[id] = std::max(confirmed[id], offset);
  if (auto it = assigned.find(id); it != assigned.end()) {
    std::lock_guard lock(registry_mu);
    it->second.committed = std::max(it->second.committed, offset);
  }
  if (snapshotter) snapshotter->committed(id, offset);
}

void Pipeline::Impl::on_snapshot_written(const PartitionId& id,
                                         const Result<state::WriteReport>& result) {
  if (!result) {
    fatal.set(fmt::format(
        "cannot write the snapshot of {} to state.dir '{}': {}. Stopping cleanly: delivered "
        "records are committed; the next start restores the last good snapshots or rebuilds "
        "from Kafka",
        id.str(), store->dir(), result.error().message));
  } else {
    spdlog::debug("snapshot of {} written: {} bytes ({} of {} chunks) in {:.1f} ms", id.str(),
                  result->bytes_written, result->chunks_written, result->chunks_total,
                  static_cast<double>(result->write_time.count()) / 1e6);
  }
  if (hooks.on_snapshot) hooks.on_snapshot(id, result);
}

bool Pipeline::Impl::all_stored_confirmed() const {
  for (const auto& [id, a] : assigned) {
    if (a.stored < 0) continue;
    auto it = confirmed.find(id);
    if (it == confirmed.end() || it->second < a.stored) return false;
  }
  return true;
}

void Pipeline::Impl::drain_until(Clock::time_point deadline, const std::function<bool()>& done) {
  // Serves callbacks (rebalance, commit results) without processing records:
  // a record fetched now is neither processed nor stored, so whoever owns its
  // partition next reads it again.
  while (!done() && Clock::now() < deadline) {
    beat_loop();
    MessagePtr msg(consumer->consume(50));
    (void)msg;
  }
}

void Pipeline::Impl::rebalance_cb(RdKafka::KafkaConsumer* c, RdKafka::ErrorCode err,
                                  std::vector<RdKafka::TopicPartition*>& partitions) {
  rebalances.fetch_add(1, std::memory_order_relaxed);
  if (err == RdKafka::ERR__ASSIGN_PARTITIONS) {
    joined_once = true;  // a SyncGroup succeeded (even with 0 partitions)
    assign(partitions);
    return;
  }
  if (err == RdKafka::ERR__REVOKE_PARTITIONS) {
    revoke(partitions);
    return;
  }
  fatal.set("consumer group rebalance failed: " + describe_kafka_error(err));
  if (c->rebalance_protocol() == "COOPERATIVE") {
    std::unique_ptr<RdKafka::Error> e(c->incremental_unassign(partitions));
  } else {
    c->unassign();
  }
}

void Pipeline::Impl::assign(std::vector<RdKafka::TopicPartition*>& partitions) {
  std::vector<PartitionId> ids;
  std::vector<RdKafka::TopicPartition*> added;  // cooperative: only what is new to us
  for (auto* tp : partitions) {
    PartitionId id{tp->topic(), tp->partition()};
    if (assigned.count(id)) continue;  // already ours (eager protocol re-assign)
    added.push_back(tp);
    ids.push_back(id);
  }
  // Recovery decides where each new partition starts. On failure the
  // partitions are still taken (librdkafka's assignment must match the
  // group's) but get no Slice: their records are skipped, never committed,
  // and the fatal error stops the service.
  if (!ids.empty() && !fatal.raised()) {
    auto fetch = recover(ids);
    if (!fetch) {
      fatal.set("recovery of the assigned partitions failed: " + fetch.error().message);
    } else {
      for (auto* tp : added) {
        auto it = fetch->find(PartitionId{tp->topic(), tp->partition()});
        if (it != fetch->end()) tp->set_offset(it->second);
      }
    }
  }
  if (consumer->rebalance_protocol() == "COOPERATIVE") {
    // Handing librdkafka a partition it already has would be an error
    // (_CONFLICT); the eager assign() below replaces the whole set instead.
    std::unique_ptr<RdKafka::Error> e(consumer->incremental_assign(added));
    if (e) fatal.set("cannot take the assigned partitions: " + e->str());
  } else {
    consumer->assign(partitions);
  }
  spdlog::info("assigned {} partition(s): {} (now {} in total)", ids.size(), join_partitions(ids),
               assigned.size());
  ready.store(true, std::memory_order_relaxed);
}

ReconcileOptions Pipeline::Impl::reader_options() const {
  ReconcileOptions o;
  o.properties = config::consumer_properties(config);
  // The short-lived readers have no event callback to hand statistics to.
  o.properties.erase("statistics.interval.ms");
  o.tail_records = config.state.reconcile_tail_records;
  return o;
}

// Recovery of newly assigned partitions (DESIGN.md "Recovery protocol",
// recovery.h): everything is read for all of them together (one committed
// offsets request, one output tail read, one window-start read), then each
// is planned, gets its Slice and a fetch position. Returns the position per
// partition (RdKafka::Topic::OFFSET_INVALID = the consumer's reset policy).
// Consumer thread; blocks the rebalance callback while it reads (bounded by
// the readers' timeouts), which librdkafka tolerates up to
// max.poll.interval.ms.
Result<std::map<PartitionId, std::int64_t>> Pipeline::Impl::recover(
    const std::vector<PartitionId>& ids,
    const std::map<PartitionId, std::int64_t>& known_committed) {
  std::map<PartitionId, std::int64_t> fetch;
  if (ids.empty()) return fetch;
  const auto t0 = Clock::now();
  auto ms_between = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  constexpr int kRequestTimeoutMs = 15'000;

  // 1. The group's committed offsets.
  std::map<PartitionId, std::optional<std::int64_t>> committed;
  {
    std::vector<RdKafka::TopicPartition*> tps;
    for (const auto& id : ids)
      tps.push_back(RdKafka::TopicPartition::create(id.topic, id.partition));
    const RdKafka::ErrorCode err = consumer->committed(tps, kRequestTimeoutMs);
    std::string failed;
    for (auto* tp : tps) {
      PartitionId id{tp->topic(), tp->partition()};
      if (err == RdKafka::ERR_NO_ERROR && tp->err() != RdKafka::ERR_NO_ERROR) {
        failed += (failed.empty() ? "" : ", ") + id.str() + ": " + describe_kafka_error(tp->err());
      }
      committed[id] = tp->offset() >= 0 ? std::optional<std::int64_t>(tp->offset()) : std::nullopt;
    }
    RdKafka::TopicPartition::destroy(tps);
    if (err != RdKafka::ERR_NO_ERROR) {
      return fail("cannot read the committed offsets of " + join_partitions(ids) + ": " +
                  describe_kafka_error(err));
    }
    if (!failed.empty()) return fail("cannot read the committed offsets: " + failed);
  }
  // delivery: transactional rollback: the offsets this member committed in
  // its last transaction (a broker that does not store transactional
  // offsets, like the test broker, would not return them; a real one
  // returns the same).
  for (const auto& [id, offset] : known_committed) {
    auto& c = committed[id];
    if (!c || *c < offset) c = offset;
  }
  // Oldest and next offset of each partition (retention, empty partitions).
  std::map<PartitionId, std::pair<std::int64_t, std::int64_t>> marks;
  for (const auto& id : ids) {
    std::int64_t low = 0, high = 0;
    if (RdKafka::ErrorCode err = consumer->query_watermark_offsets(id.topic, id.partition, &low,
                                                                   &high, kRequestTimeoutMs);
        err != RdKafka::ERR_NO_ERROR) {
      return fail("cannot read the offsets of " + id.str() + ": " + describe_kafka_error(err));
    }
    marks[id] = {low, high};
  }
  const auto t_offsets = Clock::now();

  // 2. Snapshots.
  struct Loaded {
    SnapshotOffer offer;
    std::unique_ptr<filter::SlidingFilter> filter;
    std::uint64_t bytes = 0;
  };
  std::map<PartitionId, Loaded> loaded;
  const state::StateFingerprint fingerprint =
      state::state_fingerprint(config.filter, config.tick_scale(), shared->salt_check);
  for (const auto& id : ids) {
    Loaded& l = loaded[id];
    if (store == nullptr || !config.filter_enabled) continue;  // kMissing
    auto r = store->load(state::PartitionKey{id.topic, id.partition}, fingerprint);
    l.offer = offer_from(r);
    if (r) {
      l.bytes = r->info.logical_bytes;
      l.filter = std::move(r->filter);
    }
  }
  const auto t_snapshots = Clock::now();

  // 3. The committed positions: the timestamp of the record before C bounds
  //    how old the deliveries after C can be; without a usable snapshot,
  //    also where the rebuild starts: one window (and the tick after it)
  //    before C.
  std::map<PartitionId, std::int64_t> positions;
  std::set<PartitionId> rebuild;
  for (const auto& id : ids) {
    const auto& c = committed[id];
    const auto [low, high] = marks[id];
    if (!c || *c <= low || *c - 1 >= high) continue;
    positions[id] = *c;
    const auto& snap = loaded[id].offer.snapshot;
    const bool usable = snap && snap->next_offset <= *c && snap->next_offset >= low;
    if (!usable && config.filter_enabled) rebuild.insert(id);
  }
  const filter::TickScale scale = config.tick_scale();
  auto points = find_commit_points(reader_options(), positions, rebuild,
                                   scale.window_ms() + scale.tick_ms_ceil());
  if (!points) return tl::unexpected(points.error());
  const auto t_windows = Clock::now();

  // 4. The output: what was delivered. Its tail for reconciliation
  //    (idempotent mode: what was emitted past C), back to the window start
  //    for a rebuild (less state.rebuild_lateness for records that came
  //    late), and further back where a partition's uncommitted output
  //    outgrew the tail (read_output).
  ReconcileReport tail;
  std::map<PartitionId, std::vector<std::pair<filter::Tick, filter::Fingerprint>>> learned;
  const bool reconcile = config.delivery == config::Delivery::kIdempotent;
  const std::int64_t lateness = config.state.rebuild_lateness.count();
  if (reconcile || !rebuild.empty()) {
    const ReconcileOptions opts = reader_options();
    if (output_partitions < 0) {
      auto n = output_partition_count(opts, config.output.topic);
      if (!n) return tl::unexpected(n.error());
      output_partitions = *n;
    }
    std::set<std::int32_t> read;
    std::map<std::int32_t, std::int64_t> since;
    std::map<PartitionId, Coverage> cover;
    std::map<PartitionId, std::int64_t> gone;  // rebuilds: input below this was deleted
    for (const auto& id : ids) {
      const auto point = points->find(id);
      const bool rebuilt = point != points->end() && point->second.window_offset;
      if (!reconcile && !rebuilt) continue;
      Coverage& c = cover[id];
      c.from_offset = committed[id].value_or(0);
      if (rebuilt && marks[id].first > 0) gone[id] = marks[id].first;
      if (point != points->end()) c.since_ms = point->second.timestamp_ms - lateness;
      for (std::int32_t p :
           output_partitions_to_read(config.output.partitioning, id.partition, output_partitions)) {
        read.insert(p);
        if (!rebuilt) continue;
        const std::int64_t from = point->second.since_ms - lateness;
        auto [it, added] = since.try_emplace(p, from);
        if (!added) it->second = std::min(it->second, from);
      }
    }
    // Deliveries whose input record is gone cannot be replayed: their
    // identities are learned from the output record itself, at the tick of
    // its timestamp (its partition clock was at least that).
    const filter::Fingerprinter& fingerprinter = shared->fingerprinter;
    auto learn_gone = [&](const Provenance& p, const identity::RecordView& record,
                          std::int64_t ts) {
      auto g = gone.find(p.source);
      if (g == gone.end() || p.offset >= g->second || !recovery_extractor) return;
      if (auto id = recovery_extractor->extract(record)) {
        learned[p.source].emplace_back(scale.tick(ts), fingerprinter(id->identity));
      }
    };
    auto r =
        read_output(opts, config.output.topic, std::vector<std::int32_t>(read.begin(), read.end()),
                    since, cover, gone.empty() ? DeliveryVisitor() : DeliveryVisitor(learn_gone));
    if (!r) {
      return fail(r.error().message +
                  "; not starting these partitions: without it records a previous owner "
                  "already emitted would be emitted again, or the filter could not be rebuilt");
    }
    tail = std::move(*r);
  }
  const auto t_tail = Clock::now();

  // 5. Plan, build the Slice, hand it to a worker.
  for (const auto& id : ids) {
    const auto [low, high] = marks[id];
    RecoveryInputs in;
    in.partition = id;
    in.snapshot = loaded[id].offer;
    in.committed = committed[id];
    // delivery: transactional reconciles nothing: aborted output is not
    // visible to read_committed readers and committed output matches C.
    if (reconcile) in.highest_emitted = tail.highest(id);
    in.window_ms = std::max<std::int64_t>(1, config.window_ms());
    if (auto it = points->find(id); it != points->end()) {
      in.window_start_offset = it->second.window_offset;
    }
    in.low_watermark = low;
    auto plan = plan_recovery(in);
    if (!plan) return tl::unexpected(plan.error());

    SliceStart start;
    std::uint64_t restored_bytes = 0;
    if (plan->filter == RecoveryPlan::FilterSource::kRestored) {
      start.filter = std::move(loaded[id].filter);
      start.clock_ms = plan->clock_ms;
      start.next_offset = plan->fetch_from.value_or(-1);
      restored_bytes = loaded[id].bytes;
    }
    auto slice = hooks.make_slice ? hooks.make_slice(id, options, std::move(start))
                                  : Slice::create(id, options, std::move(start));
    if (!slice) return fail("cannot set up partition " + id.str() + ": " + slice.error().message);
    std::size_t learned_from_output = 0;
    if (auto l = learned.find(id); l != learned.end() && !plan_restores(*plan)) {
      learned_from_output = learn_in_tick_order(**slice, l->second);
    }

    std::vector<std::int64_t> emitted = tail.emitted(id);
    const bool restored = plan_restores(*plan);
    ReplayRule rule(restored ? ReplayRule::Below::kSnapshot : ReplayRule::Below::kDelivered,
                    plan->committed_until, plan->rebuild_until, std::move(emitted),
                    config.output.partitioning == config::Partitioning::kInput,
                    config.on_duplicate == config::OnDuplicate::kRefresh);
    const std::size_t delivered = rule.delivered();
    (*slice)->set_replay(std::move(rule));

    Assigned a;
    a.worker = choose_worker(slices_per_worker);
    ++slices_per_worker[a.worker];
    a.tracker = (*slice)->tracker();
    a.counters = (*slice)->counters();
    a.committed = in.committed.value_or(-1);
    a.stored = in.committed.value_or(-1);
    // Replay as far as the partition holds records now; a position past
    // high can only be reached by new records, which are not replayed.
    const std::int64_t from = plan->fetch_from.value_or(low);
    a.restore_end = std::min(plan->rebuild_until, high);
    a.restoring = from < a.restore_end;
    a.assigned_at = t0;
    a.outcome.reason = plan->reason;
    a.outcome.snapshot_refusal = plan->snapshot_refusal;
    a.outcome.restored_bytes = restored_bytes;
    a.counters->restoring.store(a.restoring, std::memory_order_relaxed);
    if (in.committed) confirmed[id] = std::max(confirmed[id], *in.committed);
    if (snapshotter) snapshotter->reset(id, in.committed);

    const bool unusable =
        plan->snapshot_refusal && *plan->snapshot_refusal != SnapshotRefusal::kMissing;
    spdlog::log(unusable ? spdlog::level::warn : spdlog::level::info, "{}{}", plan->explanation,
                plan->reason == RecoveryReason::kRebuildFromWindow
                    ? fmt::format("; {} delivered records found in the output{}", delivered,
                                  learned_from_output == 0
                                      ? std::string()
                                      : fmt::format(", {} of them learned from the output "
                                                    "itself (their input is gone)",
                                                    learned_from_output))
                    : std::string());

    Work work;
    work.kind = Work::Kind::kAdopt;
    work.slice = std::move(*slice);
    workers[a.worker]->push(std::move(work));
    {
      std::lock_guard lock(registry_mu);
      assigned.insert_or_assign(id, a);
    }
    if (!a.restoring) finish_recovery(id, assigned.at(id));
    fetch[id] = plan->fetch_from.value_or(RdKafka::Topic::OFFSET_INVALID);
  }
  spdlog::info(
      "recovery of {} partition(s) planned in {:.0f} ms (offsets {:.0f} ms, snapshots {:.0f} ms, "
      "window starts {:.0f} ms, output {:.0f} ms for {} records{})",
      ids.size(), ms_between(t0, Clock::now()), ms_between(t0, t_offsets),
      ms_between(t_offsets, t_snapshots), ms_between(t_snapshots, t_windows),
      ms_between(t_windows, t_tail), tail.records_read,
      tail.extended == 0
          ? std::string()
          : fmt::format(", {} output partition(s) read back to the committed offsets: their "
                        "uncommitted output outgrew state.reconcile_tail_records",
                        tail.extended));
  return fetch;
}

void Pipeline::Impl::finish_recovery(const PartitionId& id, Assigned& a) {
  a.restoring = false;
  a.counters->restoring.store(false, std::memory_order_relaxed);
  a.outcome.seconds = std::chrono::duration<double>(Clock::now() - a.assigned_at).count();
  a.outcome.replayed = a.counters->replayed.load(std::memory_order_relaxed);
  spdlog::info("{}: recovery done ({}) in {:.2f} s, {} records replayed in rebuild mode", id.str(),
               to_string(a.outcome.reason), a.outcome.seconds, a.outcome.replayed);
  if (hooks.on_recovered) hooks.on_recovered(id, a.outcome);
}

// A restoring partition is done when its worker processed up to the end of
// the replay, or when the consumer's position passed it with nothing queued
// (the last offsets before the end can be gaps: compaction, transaction
// markers).
void Pipeline::Impl::check_restored() {
  std::vector<RdKafka::TopicPartition*> ask;
  for (auto& [id, a] : assigned) {
    if (!a.restoring) continue;
    if (a.counters->next_offset.load(std::memory_order_relaxed) >= a.restore_end) {
      finish_recovery(id, a);
    } else if (a.counters->queued.load(std::memory_order_relaxed) == 0) {
      ask.push_back(RdKafka::TopicPartition::create(id.topic, id.partition));
    }
  }
  if (ask.empty()) return;
  if (consumer->position(ask) == RdKafka::ERR_NO_ERROR) {
    for (auto* tp : ask) {
      auto it = assigned.find(PartitionId{tp->topic(), tp->partition()});
      if (it == assigned.end() || tp->err() != RdKafka::ERR_NO_ERROR) continue;
      Assigned& a = it->second;
      if (a.restoring && tp->offset() >= a.restore_end &&
          a.counters->queued.load(std::memory_order_relaxed) == 0) {
        finish_recovery(it->first, a);
      }
    }
  }
  RdKafka::TopicPartition::destroy(ask);
}

void Pipeline::Impl::revoke(std::vector<RdKafka::TopicPartition*>& partitions) {
  const bool lost = consumer->assignment_lost();
  flush_pending();
  std::vector<PartitionId> ids;
  std::map<std::uint32_t, std::vector<PartitionId>> by_worker;
  for (auto* tp : partitions) {
    PartitionId id{tp->topic(), tp->partition()};
    auto it = assigned.find(id);
    if (it == assigned.end()) continue;
    ids.push_back(id);
    by_worker[it->second.worker].push_back(id);
  }
  // 1. finish in-flight records of these partitions
  for (auto& [w, _] : by_worker) workers[w]->barrier();
  // 2. wait for their outputs, then store the final positions: librdkafka
  //    commits them when we unassign below and waits for the answer before
  //    it rejoins, so the next owner starts exactly there. Not when the
  //    partitions are already lost: another member owns them and a commit
  //    would be refused. delivery: transactional commits (or, lost, aborts)
  //    the open transaction instead.
  std::map<PartitionId, std::int64_t> final_positions;  // -1: nothing processed
  std::vector<PartitionId> capture;                     // final snapshot at the final position
  bool keep_state = true;
  if (transactional()) {
    keep_state = revoke_transactional(ids, lost, capture);
  } else if (!lost) {
    wait_delivered(ids, Clock::now() + config.shutdown_timeout);
    store_offsets(ids);
    for (const auto& id : ids) {
      const auto& a = assigned.at(id);
      final_positions[id] = a.stored;
      // Not after a fatal error: a snapshot write error is one, and the
      // service is stopping anyway.
      if (!fatal.raised() && a.stored >= 0 &&
          a.stored == a.counters->next_offset.load(std::memory_order_relaxed)) {
        capture.push_back(id);
      }
    }
  } else if (snapshotter) {
    for (const auto& id : ids) snapshotter->drop(id);
  }
  // 3. release the slices (final captures first), then hand the partitions
  //    back; the commit result releases the captures to the store.
  for (auto& [w, list] : by_worker) {
    workers[w]->barrier(keep_state ? Work::Kind::kRelease : Work::Kind::kDrop, list, capture);
    slices_per_worker[w] -= static_cast<std::uint32_t>(list.size());
  }
  {
    std::lock_guard lock(registry_mu);
    for (const auto& id : ids) assigned.erase(id);
  }
  if (consumer->rebalance_protocol() == "COOPERATIVE") {
    std::unique_ptr<RdKafka::Error> e(consumer->incremental_unassign(partitions));
    if (e) spdlog::warn("releasing partitions failed: {}", e->str());
  } else {
    consumer->unassign();
  }
  spdlog::info(
      "{} {} partition(s): {} (now {} in total){}", lost ? "lost" : "revoked", ids.size(),
      join_partitions(ids), assigned.size(),
      final_positions.empty() ? "" : "; committing " + describe_positions(final_positions));
}

Status Pipeline::Impl::run(const std::atomic<bool>& stop) {
  if (ran) return fail("a Pipeline runs only once");
  ran = true;
  for (auto& w : workers) w->start();
  delivery_thread = std::thread([this] {
    RdKafka::Producer& p = output_producer();
    while (!delivery_stop.load(std::memory_order_relaxed)) p.poll(50);
  });
  if (transactional()) {
    // Before the consumer joins: init_transactions() fences a previous
    // incarnation of this member and finishes its open transaction.
    if (auto s = start_transactions(); !s) {
      stop_threads();
      return s;
    }
  }

  if (RdKafka::ErrorCode err = consumer->subscribe(config.input.topics);
      err != RdKafka::ERR_NO_ERROR) {
    stop_threads();
    return fail("cannot subscribe to the input topics: " + describe_kafka_error(err));
  }
  spdlog::info("joined consumer group '{}' as {}", config.group_id, consumer->name());

  // Bound the records between the consumer and the workers so memory stays
  // flat when the output is slower than the input.
  const std::size_t max_queued =
      static_cast<std::size_t>(config.batch_size) * workers.size() * 8 + 1024;
  // Storing is local (no request): often enough that librdkafka's committer
  // always has a recent position, whatever its interval.
  constexpr auto kStoreEvery = std::chrono::milliseconds(50);
  auto next_store = Clock::now() + kStoreEvery;
  auto next_commit = Clock::now() + config.commit_interval;  // delivery: transactional
  const auto max_linger = std::chrono::milliseconds(5);

  while (!stop.load(std::memory_order_relaxed) && !fatal.raised()) {
    beat_loop();
    if (queued_records() > max_queued) {
      flush_pending();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      MessagePtr msg(consumer->consume(20));
      switch (msg->err()) {
        case RdKafka::ERR_NO_ERROR:
          dispatch(std::move(msg));
          break;
        case RdKafka::ERR__TIMED_OUT:
        case RdKafka::ERR__PARTITION_EOF:
          flush_pending();
          break;
        default:
          if (msg->err() == RdKafka::ERR__FATAL) {
            std::string reason;
            consumer->fatal_error(reason);
            fatal.set("consumer fatal error: " + reason);
          } else {
            spdlog::warn("consumer: {}{}", describe_kafka_error(msg->err()),
                         msg->topic_name().empty() ? "" : " (topic " + msg->topic_name() + ")");
          }
          break;
      }
      if (Clock::now() - first_pending >= max_linger) flush_pending();
    }
    if (transactional() && Clock::now() >= next_commit) {
      transaction_round();
      next_commit = Clock::now() + config.commit_interval;
    }
    if (Clock::now() >= next_store) {
      if (!transactional()) store_offsets(assigned_ids());
      check_restored();
      next_store = Clock::now() + kStoreEvery;
    }
  }

  // Shutdown: stop fetching, finish in-flight records, flush, commit, leave.
  const bool graceful = !fatal.raised();
  spdlog::info(graceful ? "shutting down: finishing in-flight records"
                        : "stopping after a fatal error; committing what was delivered");
  flush_pending();
  for (auto& w : workers) w->barrier();
  const auto deadline =
      Clock::now() + (graceful ? config.shutdown_timeout : std::chrono::milliseconds(5'000));
  wait_delivered(assigned_ids(), deadline);
  shutting_down = true;
  if (transactional()) {
    finish_transactions();
  } else {
    store_offsets(assigned_ids());
  }
  // Wait (serving callbacks) until the committer confirmed every stored
  // position: it commits only while the group is stable, so this also waits
  // out a rebalance in progress instead of committing into it. close() would
  // commit them too, but a commit sent while a rejoin is pending is refused
  // (see store_offsets()) and the next owner would read them again.
  drain_until(deadline, [this] { return all_stored_confirmed(); });
  if (!all_stored_confirmed()) {
    spdlog::warn(
        "not every final offset was confirmed within shutdown_timeout; close() tries once "
        "more, else the next owner reads those records again");
  }
  // Final snapshots at the committed positions (a capture ahead of a
  // confirmed commit waits and is never written).
  if (snapshotter && graceful) {
    for (auto& w : workers) w->barrier(Work::Kind::kCapture);
  }
  // librdkafka 2.0.2 asserts in rd_kafka_sticky_assignor_state_destroy() when
  // a cooperative-sticky member is closed before its first SyncGroup
  // completed (the assignor state is still NULL; fixed in librdkafka 2.3.0,
  // confluentinc/librdkafka#4312). Such a member holds nothing, so waiting
  // for that first round (assigned 0 partitions or more) costs no progress.
  if (!joined_once) {
    spdlog::info("waiting for the group join to complete before leaving");
    drain_until(Clock::now() + first_join_wait, [this] { return joined_once; });
  }
  // close() revokes everything through rebalance_cb (which finds nothing
  // left to do but hand the partitions back) and leaves the group.
  closed = true;
  if (RdKafka::ErrorCode err = consumer->close(); err != RdKafka::ERR_NO_ERROR) {
    spdlog::warn("leaving the consumer group: {}", describe_kafka_error(err));
  }
  const auto remaining = std::max<std::int64_t>(
      100, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  output_producer().flush(static_cast<int>(std::min<std::int64_t>(remaining, INT32_MAX)));
  stop_threads();
  if (snapshotter) {
    const auto left = std::max<std::int64_t>(
        1'000,
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (!snapshotter->wait_idle(std::chrono::milliseconds(left))) {
      spdlog::warn("snapshot writes still running after shutdown_timeout; waiting for them");
    }
    store->drain();
    const auto c = snapshotter->counts();
    spdlog::info(
        "snapshots: {} written, {} failed, {} superseded, {} not covered by a commit (not "
        "written)",
        c.written, c.failed, c.replaced, c.waiting + c.dropped);
  }
  if (transactional()) log_transaction_totals();
  if (fatal.raised()) return fail(fatal.message());
  spdlog::info("stopped cleanly");
  return {};
}

void Pipeline::Impl::stop_threads() {
  if (threads_stopped) return;
  threads_stopped = true;
  for (auto& w : workers) {
    Work stop;
    stop.kind = Work::Kind::kStop;
    w->push(std::move(stop));
  }
  for (auto& w : workers) w->join();
  delivery_stop.store(true);
  if (delivery_thread.joinable()) delivery_thread.join();
}

// ------------------------------------------------ delivery: transactional --
// One transaction per commit_interval, driven by TxnLoop (transaction.h) on
// the consumer thread: settle (hand out no records, drain the workers, wait
// for every output's acknowledgement), send the positions with the
// consumer's group metadata, commit, begin the next. An abortable failure
// aborts and rolls the partitions of the transaction back to their last
// committed state; a fatal one (fenced) stops the service. Output
// reconciliation is not used: aborted output is invisible to read_committed
// readers and committed output always matches the committed offsets.

Status Pipeline::Impl::build_transactional_producer(const config::KafkaProperties& producer_props,
                                                    const config::KafkaProperties& consumer_props) {
  auto instance = consumer_props.find("group.instance.id");
  auto id =
      transactional_id(config.group_id, instance == consumer_props.end() ? "" : instance->second);
  if (!id) return fail("delivery: transactional: " + id.error().message);
  TransactionalProducer::Options o;
  o.properties = producer_props;
  o.transactional_id = *id;
  o.delivery_reports = &reports;
  o.events = &producer_events;
  auto p = TransactionalProducer::create(std::move(o));
  if (!p) return fail("cannot create the Kafka producer: " + p.error().message);
  txn_producer = std::move(*p);
  return {};
}

Status Pipeline::Impl::start_transactions() {
  TxnOutcome init = txn_producer->init();
  if (!init.ok()) return fail("delivery: transactional: " + init.message);
  if (auto s = txn_loop->start(); !s) return fail("delivery: transactional: " + s.error().message);
  spdlog::info("delivery: transactional: transactional.id '{}', one transaction every {} ms",
               txn_producer->id(), config.commit_interval.count());
  return {};
}

void Pipeline::Impl::handle_round(const TxnLoop::Round& round) {
  if (round.ending == TxnLoop::Ending::kStopped) {
    fatal.set("delivery: transactional: " + round.message);
  }
}

void Pipeline::Impl::transaction_round() { handle_round(txn_loop->commit()); }

bool Pipeline::Impl::revoke_transactional(const std::vector<PartitionId>& ids, bool lost,
                                          std::vector<PartitionId>& capture) {
  if (!txn_loop) return true;  // run() never started transactions
  std::vector<TxnOffset> leaving;
  for (const auto& id : ids) leaving.push_back(TxnOffset{id.topic, id.partition, 0});
  // Revoked: commit the open transaction before the partitions go, so the
  // next owner starts exactly after this member's output. Lost: another
  // member may own them already; a commit would be refused: abort.
  TxnLoop::Round round = lost ? txn_loop->abort("partitions lost: " + join_partitions(ids), leaving)
                              : txn_loop->commit(leaving);
  handle_round(round);
  if (round.ending == TxnLoop::Ending::kCommitted) {
    std::map<PartitionId, std::int64_t> positions;
    for (const auto& o : round.offsets) {
      PartitionId id{o.topic, o.partition};
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) positions[id] = o.offset;
    }
    if (!positions.empty()) {
      spdlog::info("committed in the transaction: {}", describe_positions(positions));
    }
  }
  // After an abort the revoked partitions' state covers uncommitted records:
  // it must not be kept (no snapshot); the next owner starts from the
  // committed offsets.
  const bool keep =
      round.ending == TxnLoop::Ending::kCommitted || round.ending == TxnLoop::Ending::kIdle;
  for (const auto& id : ids) {
    const Assigned& a = assigned.at(id);
    if (keep && !lost && a.committed >= 0 &&
        a.committed == a.counters->next_offset.load(std::memory_order_relaxed)) {
      capture.push_back(id);  // final snapshot, at the committed position
    } else if (snapshotter) {
      snapshotter->drop(id);
    }
  }
  return keep;
}

void Pipeline::Impl::finish_transactions() {
  if (txn_loop) handle_round(txn_loop->finish());
}

void Pipeline::Impl::log_transaction_totals() const {
  if (!txn_loop) return;
  const TxnTotals t = txn_loop->totals();
  spdlog::info(
      "transactions: {} committed ({} output records), {} aborted ({} output records discarded, "
      "{} partition rollbacks)",
      t.committed, t.records_committed, t.aborted, t.records_aborted, t.partitions_rolled_back);
}

bool Pipeline::Impl::settle() {
  flush_pending();
  for (auto& w : workers) w->barrier();
  const auto ids = assigned_ids();
  wait_delivered(ids, Clock::now() + config.shutdown_timeout);
  return std::all_of(ids.begin(), ids.end(), [&](const PartitionId& id) {
    return assigned.at(id).tracker->in_flight() == 0;
  });
}

std::vector<TxnOffset> Pipeline::Impl::positions() {
  std::vector<TxnOffset> out;
  for (const auto& [id, a] : assigned) {
    std::optional<std::int64_t> pos = a.tracker->committable();
    // Records were handed out but none completed (its first output failed):
    // the partition moved all the same, from where it started.
    if (!pos && a.start_offset >= 0) pos = a.start_offset;
    // A partition replaying up to its committed offset (recovery) has not
    // moved past it: committing its replay position would go backwards.
    if (pos && *pos > a.committed) out.push_back(TxnOffset{id.topic, id.partition, *pos});
  }
  return out;
}

void Pipeline::Impl::committed(const std::vector<TxnOffset>& offsets) {
  // The same signal as the commit callback's in idempotent mode: the
  // Snapshotter may now write captures up to these offsets.
  for (const auto& o : offsets) on_committed(PartitionId{o.topic, o.partition}, o.offset);
}

Status Pipeline::Impl::roll_back(const std::vector<TxnRollback>& partitions) {
  std::vector<PartitionId> ids;
  std::map<std::uint32_t, std::vector<PartitionId>> by_worker;
  std::map<PartitionId, std::int64_t> known;    // committed by this member
  std::map<PartitionId, std::int64_t> started;  // first offset fetched since assignment
  for (const auto& p : partitions) {
    PartitionId id{p.topic, p.partition};
    auto it = assigned.find(id);
    if (it == assigned.end()) continue;
    ids.push_back(id);
    by_worker[it->second.worker].push_back(id);
    if (p.committed) known[id] = *p.committed;
    started[id] = it->second.start_offset;
  }
  // The slices hold the state of records whose output was just discarded:
  // dropped without a snapshot, and no capture taken from them is written.
  for (auto& [w, list] : by_worker) {
    workers[w]->barrier(Work::Kind::kDrop, list);
    slices_per_worker[w] -= static_cast<std::uint32_t>(list.size());
  }
  if (snapshotter) {
    for (const auto& id : ids) snapshotter->drop(id);
  }
  {
    std::lock_guard lock(registry_mu);
    for (const auto& id : ids) assigned.erase(id);
  }
  if (shutting_down || ids.empty()) return {};  // nothing is processed any more
  // The recovery of a newly assigned partition, from the offsets this member
  // committed last: the last snapshot at or before them plus a replay up to
  // them, or a rebuild from one window before them (recovery.h).
  auto fetch = recover(ids, known);
  if (!fetch) return tl::unexpected(fetch.error());
  for (const auto& id : ids) {
    auto it = fetch->find(id);
    std::int64_t target = it == fetch->end() ? RdKafka::Topic::OFFSET_INVALID : it->second;
    // Nothing committed at all: back to where the reset policy started it.
    if (target == RdKafka::Topic::OFFSET_INVALID) target = started[id];
    if (target < 0) {
      return fail("cannot roll back " + id.str() +
                  ": neither a committed nor a starting offset is known (internal error)");
    }
    std::unique_ptr<RdKafka::TopicPartition> tp(
        RdKafka::TopicPartition::create(id.topic, id.partition, target));
    if (RdKafka::ErrorCode err = consumer->seek(*tp, 10'000); err != RdKafka::ERR_NO_ERROR) {
      return fail("cannot rewind " + id.str() + " to offset " + std::to_string(target) + ": " +
                  describe_kafka_error(err));
    }
  }
  return {};
}

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() = default;

Result<std::unique_ptr<Pipeline>> Pipeline::create(const config::Config& config, SliceHooks hooks,
                                                   state::SnapshotStore* store) {
  auto impl = std::make_unique<Impl>(config, std::move(hooks), store);
  auto confirm = confirm_store_for(config, store);
  if (!confirm) return tl::unexpected(confirm.error());
  impl->options.confirm = *confirm;
  if (auto s = impl->build_clients(); !s) return tl::unexpected(s.error());
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

Status Pipeline::check_topics() { return impl_->check_topics(); }

Status Pipeline::run(const std::atomic<bool>& stop) { return impl_->run(stop); }

PipelineStats Pipeline::stats() const {
  PipelineStats s;
  s.rebalances = impl_->rebalances.load(std::memory_order_relaxed);
  if (impl_->txn_loop) {
    const TxnTotals t = impl_->txn_loop->totals();
    s.transactions.committed = t.committed;
    s.transactions.aborted = t.aborted;
    s.transactions.records_committed = t.records_committed;
    s.transactions.records_aborted = t.records_aborted;
    s.transactions.partitions_rolled_back = t.partitions_rolled_back;
  }
  s.ready = impl_->ready.load(std::memory_order_relaxed);
  if (const std::int64_t beat = impl_->loop_beat_ns.load(std::memory_order_relaxed); beat >= 0) {
    const std::int64_t now = steady_ns();
    s.consumer_loop_age_ms = std::max<std::int64_t>(0, (now - beat) / 1'000'000);
  }
  if (const auto& m = impl_->options.memory) {
    s.memory.max_bytes = m->max_bytes();
    s.memory.used_bytes = m->used();
    s.memory.effective_fpp = m->effective_fpp();
  }
  std::lock_guard lock(impl_->registry_mu);
  s.assigned_partitions = impl_->assigned.size();
  for (const auto& w : impl_->workers) s.worker_busy_nanos.push_back(w->busy_nanos());
  for (const auto& [id, a] : impl_->assigned) {
    const auto& c = *a.counters;
    PartitionStats p;
    p.topic = id.topic;
    p.partition = id.partition;
    p.worker = a.worker;
    p.records_in = c.records_in.load(std::memory_order_relaxed);
    p.distinct = c.distinct.load(std::memory_order_relaxed);
    p.duplicates = c.duplicates.load(std::memory_order_relaxed);
    p.invalid = c.invalid.load(std::memory_order_relaxed);
    p.dead_lettered = c.dead_lettered.load(std::memory_order_relaxed);
    p.invalid_dropped = c.invalid_dropped.load(std::memory_order_relaxed);
    p.invalid_passed = c.invalid_passed.load(std::memory_order_relaxed);
    p.produced = c.produced.load(std::memory_order_relaxed);
    p.delivery_errors = c.delivery_errors.load(std::memory_order_relaxed);
    p.clock_capped = c.clock_capped.load(std::memory_order_relaxed);
    p.no_timestamp = c.no_timestamp.load(std::memory_order_relaxed);
    p.clock_ms = c.clock_ms.load(std::memory_order_relaxed);
    p.next_offset = c.next_offset.load(std::memory_order_relaxed);
    p.committed_offset = a.committed;
    p.in_flight = a.tracker->in_flight();
    p.batch_times = c.batch_times.read();
    p.emit_ages = c.emit_ages.read();
    p.queued = static_cast<std::uint64_t>(
        std::max<std::int64_t>(0, c.queued.load(std::memory_order_relaxed)));
    p.replayed = c.replayed.load(std::memory_order_relaxed);
    p.restoring = c.restoring.load(std::memory_order_relaxed);
    p.invalid_reasons = c.invalid_reasons();
    p.filter_bytes = c.filter_bytes.load(std::memory_order_relaxed);
    p.filter_subfilters = c.filter_subfilters.load(std::memory_order_relaxed);
    p.filter_fpp_estimate = c.filter_fpp_estimate.load(std::memory_order_relaxed);
    p.confirm = c.confirm.read();
    s.partitions.push_back(std::move(p));
  }
  return s;
}

}  // namespace kdedup::pipeline
