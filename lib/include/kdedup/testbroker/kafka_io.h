#pragma once
// Small Kafka clients for the demo, the benchmarks and the test fixtures:
// produce records with delivery tracking, read a topic completely, query
// watermarks and a group's committed offsets. librdkafka errors are turned
// into messages that name the topic and what failed.
//
// Each object is owned and called by one thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"

namespace kdedup::testbroker {

struct Header {
  std::string name;
  std::string value;
  friend bool operator==(const Header&, const Header&) = default;
};

struct KafkaRecord {
  std::string topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::optional<std::string> key;
  std::string value;
  std::int64_t timestamp_ms = 0;
  std::vector<Header> headers;

  /// Value of the first header called `name`, if any.
  [[nodiscard]] std::optional<std::string> header(std::string_view name) const;
};

/// Extra librdkafka properties, passed through as given.
using KafkaProperties = std::map<std::string, std::string>;

/// Idempotent producer (per-partition order preserved across retries).
class RecordProducer {
 public:
  /// Called on the producing thread, from produce()/flush(), for each record
  /// the cluster acknowledged: (tag given to produce, partition, offset).
  using DeliveryFn =
      std::function<void(std::uint64_t tag, std::int32_t partition, std::int64_t offset)>;

  [[nodiscard]] static Result<std::unique_ptr<RecordProducer>> create(
      const std::string& bootstrap, const KafkaProperties& extra = {});
  ~RecordProducer();
  RecordProducer(const RecordProducer&) = delete;
  RecordProducer& operator=(const RecordProducer&) = delete;

  void on_delivery(DeliveryFn fn);

  /// Enqueues one record; `partition` -1 uses the default partitioner (by
  /// key). Waits while the local queue is full.
  [[nodiscard]] Status produce(const std::string& topic, std::int32_t partition,
                               std::optional<std::string_view> key, std::string_view value,
                               std::int64_t timestamp_ms, const std::vector<Header>& headers = {},
                               std::uint64_t tag = 0);

  /// Waits until every record is acknowledged. Fails on timeout or if any
  /// delivery failed (the first failure's reason is in the message).
  [[nodiscard]] Status flush(std::chrono::milliseconds timeout);

  [[nodiscard]] std::uint64_t delivered() const noexcept;
  [[nodiscard]] std::uint64_t failed() const noexcept;

 private:
  struct Impl;
  explicit RecordProducer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PartitionWatermarks {
  std::int32_t partition = 0;
  std::int64_t low = 0;   ///< oldest offset still stored
  std::int64_t high = 0;  ///< next offset to be written
};

/// Watermarks of every partition of `topic`, by partition id.
[[nodiscard]] Result<std::vector<PartitionWatermarks>> query_watermarks(
    const std::string& bootstrap, const std::string& topic,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// Reads every partition of `topic` from its low watermark up to the high
/// watermark at the time of the call. Records come grouped by partition, in
/// offset order.
[[nodiscard]] Result<std::vector<KafkaRecord>> read_topic(
    const std::string& bootstrap, const std::string& topic,
    std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// Committed offsets of consumer group `group` for each partition of `topic`
/// (-1 = none committed), by partition id. Does not join the group.
[[nodiscard]] Result<std::vector<std::int64_t>> committed_offsets(
    const std::string& bootstrap, const std::string& group, const std::string& topic,
    std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace kdedup::testbroker
