// The produce path: copies with provenance, delivery tags and reports
// (output_producer.h).

#include "output_producer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <thread>

#include "fatal_error.h"
#include "kafka_errors.h"
#include "kdedup/pipeline/provenance.h"
#include "message_view.h"

namespace kdedup::pipeline {

namespace {

constexpr const char* kErrorHeader = "kdedup-error";
constexpr const char* kErrorMessageHeader = "kdedup-error-message";

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

}  // namespace

void DeliveryReports::dr_cb(RdKafka::Message& message) {
  std::unique_ptr<DeliveryTag> tag(static_cast<DeliveryTag*>(message.msg_opaque()));
  if (!tag) return;
  if (message.err() == RdKafka::ERR_NO_ERROR) {
    tag->counters->produced.fetch_add(1, std::memory_order_relaxed);
    tag->tracker->delivered(tag->offset);
    return;
  }
  if (protocol_.expected(message.err())) return;
  // librdkafka has already retried what was retriable: this failure is
  // permanent. Never skip, never commit past.
  tag->counters->delivery_errors.fetch_add(1, std::memory_order_relaxed);
  std::string reason = "could not deliver the " + std::string(tag->destination) +
                       " record for input " + source_of(message) + " to topic '" +
                       message.topic_name() + "': " + describe_kafka_error(message.err());
  tag->tracker->failed(tag->offset, reason);
  protocol_.output_failed(tag->epoch, std::move(reason));
}

OutputProducer::Produced OutputProducer::produce(Slice& slice, rd_kafka_message_t& in,
                                                 const std::string& topic, std::int32_t partition,
                                                 const char* destination,
                                                 const identity::ExtractError* error) {
  // librdkafka's C API: the input's header list taken over rather than
  // copied, the provenance added without building strings, and the topic
  // by handle.
  rd_kafka_headers_t* headers = nullptr;
  if (rd_kafka_message_detach_headers(&in, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    headers = rd_kafka_headers_new(error != nullptr ? 5 : 3);
  }
  HeadersGuard owned_headers{headers};
  const fmt::format_int offset_text(in.offset);
  const fmt::format_int partition_text(in.partition);
  add_header(headers, kProvenanceTopicHeader, rd_kafka_topic_name(in.rkt));
  add_header(headers, kProvenancePartitionHeader,
             std::string_view(partition_text.data(), partition_text.size()));
  add_header(headers, kProvenanceOffsetHeader,
             std::string_view(offset_text.data(), offset_text.size()));
  if (error != nullptr) {
    add_header(headers, kErrorHeader, identity::to_string(error->reason));
    add_header(headers, kErrorMessageHeader, error->message);
  }
  // Timestamps <= 0 cannot be produced as such (0 asks the producer for
  // "now"); they leave with the time of production.
  const std::int64_t out_ts = std::max<std::int64_t>(timestamp_ms(in), 0);
  auto tag = std::make_unique<DeliveryTag>(
      DeliveryTag{slice.tracker(), slice.counters(), in.offset, destination, protocol_.epoch()});
  rd_kafka_topic_t* rkt = topic_handle(topic);
  const std::size_t key_len = in.key != nullptr ? in.key_len : 0;
  for (;;) {
    const auto err =
        rkt == nullptr
            ? RdKafka::ERR__UNKNOWN_TOPIC
            : static_cast<RdKafka::ErrorCode>(rd_kafka_producev(
                  producer_.c_ptr(), RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(partition),
                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(in.payload, in.len),
                  RD_KAFKA_V_KEY(in.key, key_len), RD_KAFKA_V_TIMESTAMP(out_ts),
                  RD_KAFKA_V_HEADERS(headers), RD_KAFKA_V_OPAQUE(tag.get()), RD_KAFKA_V_END));
    if (err == RdKafka::ERR_NO_ERROR) {
      owned_headers.headers = nullptr;   // librdkafka owns them now
      static_cast<void>(tag.release());  // comes back in the delivery report
      if (error == nullptr && topic == output_topic_) protocol_.produced_output();
      return Produced::kQueued;
    }
    if (err == RdKafka::ERR__QUEUE_FULL && !fatal_.raised()) {
      // The delivery thread drains the queue; wait for room.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    std::string reason = "could not produce the " + std::string(destination) +
                         " record for input " + slice.id().str() + "@" + offset_text.str() +
                         " to topic '" + topic + "': " + describe_kafka_error(err);
    slice.counters()->delivery_errors.fetch_add(1, std::memory_order_relaxed);
    slice.tracker()->failed(in.offset, reason);
    return protocol_.output_failed(tag->epoch, std::move(reason)) ? Produced::kStopped
                                                                  : Produced::kRefused;
  }
}

rd_kafka_topic_t* OutputProducer::topic_handle(const std::string& name) {
  for (const auto& [n, rkt] : topics_) {
    if (n == name) return rkt;
  }
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(producer_.c_ptr(), name.c_str(), nullptr);
  if (rkt != nullptr) topics_.emplace_back(name, rkt);
  return rkt;  // null: an invalid name, reported by produce()
}

void OutputProducer::release_topics() noexcept {
  for (auto& [name, rkt] : topics_) rd_kafka_topic_destroy(rkt);
  topics_.clear();
}

}  // namespace kdedup::pipeline
