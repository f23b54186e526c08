// delivery: idempotent (the default): at-least-once output with an
// idempotent producer, made duplicate-free across restarts and rebalances
// by output reconciliation (recovery).
//
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

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "assigned_partitions.h"
#include "commit_protocol.h"
#include "fatal_error.h"
#include "kafka_clients.h"
#include "kafka_errors.h"
#include "kdedup/pipeline/snapshotter.h"
#include "output_producer.h"
#include "partition_log.h"

namespace kdedup::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

/// The idempotent commit protocol. Owned by the Pipeline; the consumer
/// thread stores positions and serves the commit callback (offset_commit_cb
/// runs inside the consumer's poll); the produce path may call from any
/// thread.
class IdempotentCommits final : public CommitProtocol, public RdKafka::OffsetCommitCb {
 public:
  explicit IdempotentCommits(const CommitContext& context) : context_(context), reports_(*this) {}

  Status build_producer(const config::KafkaProperties& properties,
                        const std::function<void(std::string_view)>& on_statistics) override {
    events_.emplace([this](std::string reason) { output_failed(0, std::move(reason)); }, "producer",
                    on_statistics);
    auto p = pipeline::build_producer(properties, reports_, *events_);
    if (!p) return tl::unexpected(p.error());
    producer_ = std::move(*p);
    return {};
  }

  RdKafka::OffsetCommitCb* configure_consumer(config::KafkaProperties& properties) override {
    // librdkafka's committer commits what store_offsets() stored, only while
    // the group is stable, and a revoked partition's position before it
    // rejoins (see the top of this file).
    properties["enable.auto.commit"] = "true";
    properties["auto.commit.interval.ms"] =
        std::to_string(std::max<std::int64_t>(1, context_.config.commit_interval.count()));
    return this;
  }
  void attach(RdKafka::KafkaConsumer& consumer) override { consumer_ = &consumer; }
  RdKafka::Producer& producer() override { return *producer_; }

  [[nodiscard]] std::uint64_t epoch() const noexcept override { return 0; }
  void produced_output() noexcept override {}
  [[nodiscard]] bool expected(RdKafka::ErrorCode) const noexcept override { return false; }
  bool output_failed(std::uint64_t, std::string reason) override {
    // librdkafka has already retried what was retriable (idempotent
    // producer): the output is lost for good. Stop; never commit past it.
    context_.fatal.set(std::move(reason));
    return true;
  }

  Status start() override { return {}; }
  void on_loop_turn(Clock::time_point now) override;
  [[nodiscard]] bool output_ahead_of_commits() const noexcept override { return true; }
  Handover hand_over(const std::vector<PartitionId>& ids, bool lost) override;
  void finish() override {
    shutting_down_ = true;
    store_offsets(context_.partitions.ids());
  }
  void log_totals() const override {}
  [[nodiscard]] TxnTotals totals() const override { return {}; }

  void offset_commit_cb(RdKafka::ErrorCode err,
                        std::vector<RdKafka::TopicPartition*>& offsets) override;

 private:
  void store_offsets(const std::vector<PartitionId>& ids);

  CommitContext context_;
  DeliveryReports reports_;
  std::optional<ClientEvents> events_;
  std::unique_ptr<RdKafka::Producer> producer_;
  RdKafka::KafkaConsumer* consumer_ = nullptr;
  Clock::time_point next_store_{};
  bool shutting_down_ = false;
};

void IdempotentCommits::on_loop_turn(Clock::time_point now) {
  // Storing is local (no request): often enough that librdkafka's committer
  // always has a recent position, whatever its interval.
  constexpr auto kStoreEvery = std::chrono::milliseconds(50);
  if (next_store_ == Clock::time_point{}) next_store_ = now + kStoreEvery;
  if (now < next_store_) return;
  store_offsets(context_.partitions.ids());
  next_store_ = Clock::now() + kStoreEvery;
}

Handover IdempotentCommits::hand_over(const std::vector<PartitionId>& ids, bool lost) {
  Handover h;
  if (lost) {
    // Another member owns them already; a commit would be refused.
    if (context_.snapshotter != nullptr) {
      for (const auto& id : ids) context_.snapshotter->drop(id);
    }
    return h;
  }
  // Wait for their outputs, then store the final positions: librdkafka
  // commits them when the partitions are unassigned and waits for the
  // answer before it rejoins, so the next owner starts exactly there.
  context_.partitions.wait_delivered(ids, Clock::now() + context_.config.shutdown_timeout);
  store_offsets(ids);
  for (const auto& id : ids) {
    const auto& a = context_.partitions.at(id);
    h.final_positions[id] = a.stored;
    // Not after a fatal error: a snapshot write error is one, and the
    // service is stopping anyway.
    if (!context_.fatal.raised() && a.stored >= 0 &&
        a.stored == a.counters->next_offset.load(std::memory_order_relaxed)) {
      h.capture.push_back(id);
    }
  }
  return h;
}

void IdempotentCommits::store_offsets(const std::vector<PartitionId>& ids) {
  std::vector<StorePosition> positions;
  std::vector<Assigned*> updated;
  for (const auto& id : ids) {
    Assigned* a = context_.partitions.find(id);
    if (a == nullptr) continue;
    auto pos = a->tracker->committable();
    if (!pos || *pos <= a->stored) continue;
    positions.push_back({&id.topic, id.partition, *pos});
    updated.push_back(a);
  }
  if (positions.empty()) return;
  const auto errors = store_positions(*consumer_, positions);
  std::map<std::string, std::map<PartitionId, std::int64_t>> failed;  // by reason
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (errors[i] == RdKafka::ERR_NO_ERROR) {
      updated[i]->stored = positions[i].offset;
    } else {
      failed[describe_kafka_error(errors[i])]
            [PartitionId{*positions[i].topic, positions[i].partition}] = positions[i].offset;
    }
  }
  for (const auto& [reason, stored] : failed) {
    spdlog::warn("cannot hand {} to the committer: {}; it will be retried",
                 describe_positions(stored), reason);
  }
}

void IdempotentCommits::offset_commit_cb(RdKafka::ErrorCode err,
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
      if (context_.snapshotter != nullptr && !context_.partitions.contains(id)) {
        context_.snapshotter->drop(id);
      }
      continue;
    }
    if (tp->offset() < 0) continue;
    context_.on_committed(id, tp->offset());
    // Final commits (of partitions already handed back, or at shutdown) are
    // what an operator checks after a rebalance; the periodic ones are noise.
    if (!context_.partitions.contains(id) || shutting_down_) released[id] = tp->offset();
  }
  for (const auto& [reason, positions] : failed) {
    spdlog::warn("commit of {} failed: {}; records after the last commit will be read again",
                 describe_positions(positions), reason);
  }
  if (!released.empty()) spdlog::info("committed {}", describe_positions(released));
}

}  // namespace

std::unique_ptr<CommitProtocol> make_idempotent_commits(const CommitContext& context) {
  return std::make_unique<IdempotentCommits>(context);
}

}  // namespace kdedup::pipeline
