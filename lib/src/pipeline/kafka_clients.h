#pragma once
// The librdkafka clients of `kdedup run`: properties (kdedup's defaults, then
// the user's, then the keys correctness depends on), the client event
// callback, and the check of the topics against the config. Everything here
// runs on the thread that creates the Pipeline, before run(), except
// ClientEvents (see there).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/common/result.h"
#include "kdedup/config/config.h"

namespace kdedup::pipeline {

/// Applies librdkafka properties; the error names the property.
[[nodiscard]] Status apply_properties(RdKafka::Conf& conf, const config::KafkaProperties& props,
                                      const char* section);

/// The producer's properties: kdedup's defaults (linger, message size,
/// statistics when `statistics` is set), then the user's (`kafka`,
/// `producer`), then enable.idempotence.
[[nodiscard]] config::KafkaProperties producer_properties_for(const config::Config& config,
                                                              bool statistics);

/// An idempotent producer with these callbacks (they must outlive it).
[[nodiscard]] Result<std::unique_ptr<RdKafka::Producer>> build_producer(
    const config::KafkaProperties& properties, RdKafka::DeliveryReportCb& reports,
    RdKafka::EventCb& events);

/// One position to hand to librdkafka's committer: the next offset to read.
struct StorePosition {
  const std::string* topic;
  std::int32_t partition;
  std::int64_t offset;
};

/// Stores `positions` for the consumer's committer (one local call, no
/// request); the error of each, in order (ERR_NO_ERROR = stored).
/// Through librdkafka's C API: its C++ offsets_store() matches each result
/// back to its input by a linear search with a dynamic_cast and a strcmp per
/// candidate, quadratic in the partitions stored at once.
[[nodiscard]] std::vector<RdKafka::ErrorCode> store_positions(
    RdKafka::KafkaConsumer& consumer, const std::vector<StorePosition>& positions);

/// What the consumer calls back; each must outlive the consumer.
struct ConsumerCallbacks {
  RdKafka::RebalanceCb* rebalance = nullptr;
  RdKafka::OffsetCommitCb* commits = nullptr;  ///< null: nothing is committed through it
  RdKafka::EventCb* events = nullptr;
};

/// The group consumer build_consumer() made, and what its session timeout
/// implies for a stop before the first join.
struct BuiltConsumer {
  std::unique_ptr<RdKafka::KafkaConsumer> consumer;
  /// How long a member stopped before its first group join completed waits
  /// for it: a join takes at most about a session timeout.
  std::chrono::milliseconds first_join_wait{50'000};
};

/// The group consumer: reset policy earliest, the user's properties, the
/// group, `extra` (what the delivery mode adds), and positions stored only
/// by kdedup (enable.auto.offset.store = false).
[[nodiscard]] Result<BuiltConsumer> build_consumer(const config::Config& config, bool statistics,
                                                   const config::KafkaProperties& extra,
                                                   const ConsumerCallbacks& callbacks);

/// Leaves a group consumer that never completed a SyncGroup to the
/// process's exit instead of destroying it. librdkafka 2.0.2 aborts
/// (rd_kafka_sticky_assignor_state_destroy: assertion `assignor_state`)
/// when a cooperative-sticky member is destroyed after its JoinGroup was
/// answered but before its first SyncGroup completed, since its assignor
/// state is still NULL (fixed in 2.3.0: confluentinc/librdkafka#4312).
/// Such a member holds no partitions and, once closed, has left the group;
/// its logging is silenced and its event callback (`events`), which its
/// threads may still call for a log line, is kept with it.
void abandon_unsynced_consumer(std::unique_ptr<RdKafka::KafkaConsumer> consumer,
                               std::unique_ptr<RdKafka::EventCb> events);

class FatalError;

/// What a consume loop does with a consumed message's error code.
enum class Consumed : std::uint8_t {
  kRecord,  ///< a record: process it
  kIdle,    ///< nothing arrived (timeout) or a partition's end was reached
  kError,   ///< handled here: a fatal error raised on `fatal`, else a warning logged
};

/// Classifies `err`; for kError, raises ERR__FATAL (with the consumer's
/// reason) on `fatal` or logs a warning as `who` ("consumer",
/// "repartition consumer"), naming `topic` when it is known.
[[nodiscard]] Consumed classify_consumed(RdKafka::ErrorCode err, std::string_view topic,
                                         RdKafka::KafkaConsumer& consumer, FatalError& fatal,
                                         std::string_view who);

/// Fetches metadata and checks that every input topic, the output topic and
/// the DLQ / duplicates topics exist, and that with `output.partitioning:
/// input` the output topic has at least as many partitions as each input
/// topic. Sets `output_partitions` when the output topic exists. Errors
/// name the topic and say what to change.
[[nodiscard]] Status check_topics(RdKafka::KafkaConsumer& consumer, const config::Config& config,
                                  std::int32_t& output_partitions);

/// Client-level events of one client: fatal errors go to `on_fatal`; the
/// rest are logged. With an event callback set, librdkafka also delivers
/// its own log lines here (from its internal threads), so they are
/// forwarded to our log: without that, `kafka.debug: cgrp,consumer` would
/// print nothing. Called by every thread that serves the client's queue (a
/// producer's: the delivery thread, and the consumer thread inside flush()
/// and the transactional calls, at the same time) and by librdkafka's
/// threads; owned by the Pipeline, outlives the client.
class ClientEvents final : public RdKafka::EventCb {
 public:
  /// `on_statistics` (may hold an empty function) outlives this object.
  ClientEvents(std::function<void(std::string)> on_fatal, const char* client,
               const std::function<void(std::string_view)>& on_statistics)
      : on_fatal_(std::move(on_fatal)), client_(client), on_statistics_(on_statistics) {}
  void event_cb(RdKafka::Event& event) override;

 private:
  std::function<void(std::string)> on_fatal_;
  const char* client_;
  const std::function<void(std::string_view)>& on_statistics_;
  std::mutex mu_;  // the repeated-error limit below
  std::chrono::steady_clock::time_point last_log_{};
  RdKafka::ErrorCode last_err_ = RdKafka::ERR_NO_ERROR;
};

}  // namespace kdedup::pipeline
