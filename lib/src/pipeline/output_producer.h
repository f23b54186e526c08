#pragma once
// The produce path of `kdedup run`: every output (distinct record, routed
// duplicate, dead letter) is a copy of its input record (key, value,
// headers, timestamp) plus the provenance headers, produced with a
// DeliveryTag that brings its delivery report back to the partition's
// OffsetTracker. What a failure does is the CommitProtocol's decision.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include "commit_protocol.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/pipeline/slice.h"

namespace kdedup::pipeline {

class FatalError;

/// Travels with one produced record as its msg_opaque and comes back in the
/// delivery report. Holds shared ownership so a report arriving after the
/// partition was released still has somewhere to go.
/// One allocation per produced record and nothing to format: where the
/// record came from is in its provenance headers, read on failure only.
struct DeliveryTag {
  std::shared_ptr<OffsetTracker> tracker;
  std::shared_ptr<PartitionCounters> counters;
  std::int64_t offset;
  const char* destination;  // "output", "duplicates" or "dead-letter"
  std::uint64_t epoch = 0;  // CommitProtocol::epoch() when it was produced
};

/// The producer's delivery reports: an acknowledged output moves its
/// partition's OffsetTracker; a failed one pins it there (the commit
/// position never passes it) and goes to the CommitProtocol. Called on the
/// delivery thread (the one that polls the producer); owned by the protocol.
class DeliveryReports final : public RdKafka::DeliveryReportCb {
 public:
  explicit DeliveryReports(CommitProtocol& protocol) : protocol_(protocol) {}
  void dr_cb(RdKafka::Message& message) override;

 private:
  CommitProtocol& protocol_;
};

/// One worker's side of the producer: produces the copies and owns the
/// worker's topic handles (a handful: output, duplicates, dead letters;
/// by name, every record would be a locked lookup). Worker thread only;
/// release_topics() before the producer goes.
class OutputProducer {
 public:
  OutputProducer(RdKafka::Producer& producer, CommitProtocol& protocol, const FatalError& fatal,
                 std::string output_topic)
      : producer_(producer),
        protocol_(protocol),
        fatal_(fatal),
        output_topic_(std::move(output_topic)) {}
  OutputProducer(const OutputProducer&) = delete;
  OutputProducer& operator=(const OutputProducer&) = delete;
  ~OutputProducer() { release_topics(); }

  enum class Produced : std::uint8_t {
    kQueued,   ///< the producer took it; its delivery report will follow
    kRefused,  ///< refused; the protocol goes on without it (dooms the transaction)
    kStopped,  ///< refused, and the service stops: process nothing more
  };

  /// Produces a copy of `in` to `topic` / `partition` (RD_KAFKA_PARTITION_UA:
  /// the partitioner), with the error headers for a dead letter (`error`).
  /// Waits while the producer's queue is full. `in` gives its header list
  /// to the copy: nothing may read `in`'s headers (or views of them) after.
  Produced produce(Slice& slice, rd_kafka_message_t& in, const std::string& topic,
                   std::int32_t partition, const char* destination,
                   const identity::ExtractError* error);

  void release_topics() noexcept;

 private:
  rd_kafka_topic_t* topic_handle(const std::string& name);

  RdKafka::Producer& producer_;
  CommitProtocol& protocol_;
  const FatalError& fatal_;
  const std::string output_topic_;
  std::vector<std::pair<std::string, rd_kafka_topic_t*>> topics_;
};

}  // namespace kdedup::pipeline
