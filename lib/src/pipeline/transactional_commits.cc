// delivery: transactional: one transaction per commit_interval, driven by
// TxnLoop (transaction.h) on the consumer thread: settle (hand out no
// records, drain the workers, wait for every output's acknowledgement),
// send the positions with the consumer's group metadata, commit, begin the
// next. An abortable failure aborts and rolls the partitions of the
// transaction back to their last committed state; a fatal one (fenced)
// stops the service. Output reconciliation is not used: aborted output is
// invisible to read_committed readers and committed output always matches
// the committed offsets. See docs/operations.md "Exactly-once mode".

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>

#include "assigned_partitions.h"
#include "commit_protocol.h"
#include "fatal_error.h"
#include "kafka_clients.h"
#include "kafka_errors.h"
#include "kdedup/pipeline/snapshotter.h"
#include "output_producer.h"
#include "partition_log.h"
#include "partition_recovery.h"
#include "worker.h"

namespace kdedup::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

/// What the workers and the delivery reports tell the consumer thread
/// about the open transaction. A failed produce or delivery does not stop
/// the service in this mode: it dooms the open transaction, which is
/// aborted and redone (librdkafka would fail its commit as abortable
/// anyway). Thread-safe.
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

/// The transactional commit protocol, and the TxnHost its TxnLoop runs
/// against. Owned by the Pipeline; every transactional call comes from the
/// consumer thread (librdkafka forbids concurrent ones); the produce path
/// may call from any thread.
class TransactionalCommits final : public CommitProtocol, public TxnHost {
 public:
  explicit TransactionalCommits(const CommitContext& context)
      : context_(context), reports_(*this) {}

  Status build_producer(const config::KafkaProperties& properties,
                        const std::function<void(std::string_view)>& on_statistics) override;
  RdKafka::OffsetCommitCb* configure_consumer(config::KafkaProperties&) override {
    return nullptr;  // the offsets travel in the transaction (send_offsets)
  }
  void attach(RdKafka::KafkaConsumer& consumer) override {
    consumer_ = &consumer;
    calls_ = std::make_unique<ProducerTxnCalls>(*producer_, consumer);
    loop_ = std::make_unique<TxnLoop>(*calls_, *this);
  }
  RdKafka::Producer& producer() override { return producer_->producer(); }

  [[nodiscard]] std::uint64_t epoch() const noexcept override { return open_.epoch(); }
  void produced_output() noexcept override { open_.count_output(); }
  [[nodiscard]] bool expected(RdKafka::ErrorCode err) const noexcept override {
    // Records purged by our own abort_transaction() come back too: their
    // transaction is already gone, nothing to report.
    return err == RdKafka::ERR__PURGE_QUEUE || err == RdKafka::ERR__PURGE_INFLIGHT;
  }
  bool output_failed(std::uint64_t epoch, std::string reason) override {
    // The transaction is redone from its start; the worker goes on. A
    // fatal producer error stops the service at the loop's next round:
    // every transactional call fails from now on, and its message names
    // the transactional.id (e.g. fenced by a newer instance).
    open_.doom(epoch, std::move(reason));
    return false;
  }

  Status start() override;
  void on_loop_turn(Clock::time_point now) override;
  [[nodiscard]] bool output_ahead_of_commits() const noexcept override { return false; }
  Handover hand_over(const std::vector<PartitionId>& ids, bool lost) override;
  void finish() override {
    shutting_down_ = true;
    if (loop_) handle(loop_->finish());
  }
  void log_totals() const override;
  [[nodiscard]] TxnTotals totals() const override { return loop_ ? loop_->totals() : TxnTotals{}; }

  // TxnHost
  bool settle() override;
  std::vector<TxnOffset> positions() override;
  std::uint64_t open_outputs() override { return open_.outputs(); }
  std::optional<std::string> abort_reason() override { return open_.doomed(); }
  void began() override { open_.next(); }
  void committed(const std::vector<TxnOffset>& offsets) override;
  Status roll_back(const std::vector<TxnRollback>& partitions) override;

 private:
  void handle(const TxnLoop::Round& round);
  void log_committed(const TxnLoop::Round& round, const std::vector<PartitionId>& ids) const;
  [[nodiscard]] Status rewind(const std::vector<PartitionId>& ids, const FetchPositions& fetch,
                              const std::map<PartitionId, std::int64_t>& started);

  CommitContext context_;
  OpenTransaction open_;
  DeliveryReports reports_;
  std::optional<ClientEvents> events_;
  std::unique_ptr<TransactionalProducer> producer_;
  std::unique_ptr<ProducerTxnCalls> calls_;
  std::unique_ptr<TxnLoop> loop_;
  RdKafka::KafkaConsumer* consumer_ = nullptr;
  Clock::time_point next_commit_{};
  bool shutting_down_ = false;
};

Status TransactionalCommits::build_producer(
    const config::KafkaProperties& properties,
    const std::function<void(std::string_view)>& on_statistics) {
  events_.emplace([this](std::string reason) { output_failed(epoch(), std::move(reason)); },
                  "producer", on_statistics);
  const auto consumer_props = config::consumer_properties(context_.config);
  auto instance = consumer_props.find("group.instance.id");
  auto id = transactional_id(context_.config.group_id,
                             instance == consumer_props.end() ? "" : instance->second);
  if (!id) return fail("delivery: transactional: " + id.error().message);
  TransactionalProducer::Options o;
  o.properties = properties;
  o.transactional_id = *id;
  o.delivery_reports = &reports_;
  o.events = &*events_;
  auto p = TransactionalProducer::create(std::move(o));
  if (!p) return fail("cannot create the Kafka producer: " + p.error().message);
  producer_ = std::move(*p);
  return {};
}

Status TransactionalCommits::start() {
  TxnOutcome init = producer_->init();
  if (!init.ok()) return fail("delivery: transactional: " + init.message);
  if (auto s = loop_->start(); !s) return fail("delivery: transactional: " + s.error().message);
  spdlog::info("delivery: transactional: transactional.id '{}', one transaction every {} ms",
               producer_->id(), context_.config.commit_interval.count());
  return {};
}

void TransactionalCommits::on_loop_turn(Clock::time_point now) {
  if (next_commit_ == Clock::time_point{}) next_commit_ = now + context_.config.commit_interval;
  if (now < next_commit_) return;
  handle(loop_->commit());
  next_commit_ = Clock::now() + context_.config.commit_interval;
}

void TransactionalCommits::handle(const TxnLoop::Round& round) {
  if (round.ending == TxnLoop::Ending::kStopped) {
    context_.fatal.set("delivery: transactional: " + round.message);
  }
}

Handover TransactionalCommits::hand_over(const std::vector<PartitionId>& ids, bool lost) {
  Handover h;
  if (!loop_) return h;  // run() never started transactions
  std::vector<TxnOffset> leaving;
  leaving.reserve(ids.size());
  for (const auto& id : ids) leaving.push_back(TxnOffset{id.topic, id.partition, 0});
  // Revoked: commit the open transaction before the partitions go, so the
  // next owner starts exactly after this member's output. Lost: another
  // member may own them already; a commit would be refused: abort.
  TxnLoop::Round round = lost ? loop_->abort("partitions lost: " + join_partitions(ids), leaving)
                              : loop_->commit(leaving);
  handle(round);
  if (round.ending == TxnLoop::Ending::kCommitted) log_committed(round, ids);
  // After an abort the revoked partitions' state covers uncommitted records:
  // it must not be kept (no snapshot); the next owner starts from the
  // committed offsets.
  h.keep_state =
      round.ending == TxnLoop::Ending::kCommitted || round.ending == TxnLoop::Ending::kIdle;
  for (const auto& id : ids) {
    const Assigned& a = context_.partitions.at(id);
    if (h.keep_state && !lost && a.committed >= 0 &&
        a.committed == a.counters->next_offset.load(std::memory_order_relaxed)) {
      h.capture.push_back(id);  // final snapshot, at the committed position
    } else if (context_.snapshotter != nullptr) {
      context_.snapshotter->drop(id);
    }
  }
  return h;
}

void TransactionalCommits::log_committed(const TxnLoop::Round& round,
                                         const std::vector<PartitionId>& ids) const {
  std::map<PartitionId, std::int64_t> positions;
  for (const auto& o : round.offsets) {
    PartitionId id{o.topic, o.partition};
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) positions[id] = o.offset;
  }
  if (!positions.empty()) {
    spdlog::info("committed in the transaction: {}", describe_positions(positions));
  }
}

void TransactionalCommits::log_totals() const {
  if (!loop_) return;
  const TxnTotals t = loop_->totals();
  spdlog::info(
      "transactions: {} committed ({} output records), {} aborted ({} output records discarded, "
      "{} partition rollbacks)",
      t.committed, t.records_committed, t.aborted, t.records_aborted, t.partitions_rolled_back);
}

bool TransactionalCommits::settle() {
  context_.workers.flush();
  context_.workers.barrier_all();
  const auto ids = context_.partitions.ids();
  context_.partitions.wait_delivered(ids, Clock::now() + context_.config.shutdown_timeout);
  return context_.partitions.in_flight(ids) == 0;
}

std::vector<TxnOffset> TransactionalCommits::positions() {
  std::vector<TxnOffset> out;
  for (const auto& [id, a] : context_.partitions.all()) {
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

void TransactionalCommits::committed(const std::vector<TxnOffset>& offsets) {
  // The same signal as the commit callback's in idempotent mode: the
  // Snapshotter may now write captures up to these offsets.
  for (const auto& o : offsets) context_.on_committed(PartitionId{o.topic, o.partition}, o.offset);
}

Status TransactionalCommits::roll_back(const std::vector<TxnRollback>& partitions) {
  std::vector<PartitionId> ids;
  std::map<PartitionId, std::int64_t> known;    // committed by this member
  std::map<PartitionId, std::int64_t> started;  // first offset fetched since assignment
  for (const auto& p : partitions) {
    PartitionId id{p.topic, p.partition};
    const Assigned* a = context_.partitions.find(id);
    if (a == nullptr) continue;
    ids.push_back(id);
    if (p.committed) known[id] = *p.committed;
    started[id] = a->start_offset;
  }
  // The slices hold the state of records whose output was just discarded:
  // dropped without a snapshot, and no capture taken from them is written.
  context_.workers.release(context_.partitions.by_worker(ids), Work::Kind::kDrop);
  if (context_.snapshotter != nullptr) {
    for (const auto& id : ids) context_.snapshotter->drop(id);
  }
  context_.partitions.erase(ids);
  if (shutting_down_ || ids.empty()) return {};  // nothing is processed any more
  // The recovery of a newly assigned partition, from the offsets this member
  // committed last: the last snapshot at or before them plus a replay up to
  // them, or a rebuild from one window before them (recovery.h).
  auto fetch = Recovery(context_.recovery, ids, known).run();
  if (!fetch) return tl::unexpected(fetch.error());
  return rewind(ids, *fetch, started);
}

/// Seeks each rolled-back partition to where its recovery starts.
Status TransactionalCommits::rewind(const std::vector<PartitionId>& ids,
                                    const FetchPositions& fetch,
                                    const std::map<PartitionId, std::int64_t>& started) {
  for (const auto& id : ids) {
    auto it = fetch.find(id);
    std::int64_t target = it == fetch.end() ? RdKafka::Topic::OFFSET_INVALID : it->second;
    // Nothing committed at all: back to where the reset policy started it.
    if (target == RdKafka::Topic::OFFSET_INVALID) target = started.at(id);
    if (target < 0) {
      return fail("cannot roll back " + id.str() +
                  ": neither a committed nor a starting offset is known (internal error)");
    }
    std::unique_ptr<RdKafka::TopicPartition> tp(
        RdKafka::TopicPartition::create(id.topic, id.partition, target));
    if (RdKafka::ErrorCode err = consumer_->seek(*tp, 10'000); err != RdKafka::ERR_NO_ERROR) {
      return fail("cannot rewind " + id.str() + " to offset " + std::to_string(target) + ": " +
                  describe_kafka_error(err));
    }
  }
  return {};
}

}  // namespace

std::unique_ptr<CommitProtocol> make_transactional_commits(const CommitContext& context) {
  return std::make_unique<TransactionalCommits>(context);
}

}  // namespace kdedup::pipeline
