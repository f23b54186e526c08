#pragma once
// Parser for librdkafka's statistics JSON (the `statistics.interval.ms`
// callback payload, see librdkafka's STATISTICS.md). Only the fields kdedup
// exports are read; unknown fields are ignored so newer librdkafka versions
// keep working.
//
// Called from librdkafka's stats callback (its background/poll thread);
// the function is reentrant.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"

namespace kdedup::metrics {

/// One partition's consumer lag as reported by the consumer handle.
struct PartitionLag {
  std::string topic;
  std::int32_t partition = 0;
  /// Messages between the high watermark (or last stable offset under
  /// read_committed) and the committed offset; -1 when unknown.
  std::int64_t consumer_lag = 0;
  /// Messages fetched and not yet taken by the application: the next
  /// offset to fetch minus the offset after the last message taken
  /// (`next_offset` - `app_offset`); 0 when either is unknown.
  std::int64_t unread = 0;
};

/// The subset of one statistics document kdedup uses.
struct ClientStatistics {
  std::string name;                   ///< client instance name ("rdkafka#consumer-1")
  std::string type;                   ///< "consumer" or "producer"
  std::int64_t ts_us = 0;             ///< librdkafka's monotonic clock, microseconds
  std::int64_t msg_cnt = 0;           ///< messages in the producer queue
  std::int64_t msg_size = 0;          ///< bytes in the producer queue
  std::int64_t rebalance_cnt = -1;    ///< cgrp.rebalance_cnt; -1 when absent
  std::int64_t assignment_size = -1;  ///< cgrp.assignment_size; -1 when absent
  /// Partitions with a known lag or unread messages. The internal UA
  /// partition (-1) and partitions with neither (not assigned, or nothing
  /// committed yet and nothing fetched) are left out.
  std::vector<PartitionLag> lags;
};

/// Parses one statistics document. Malformed JSON or a document that is not
/// an object, or fields of the wrong type, give an error naming the field.
[[nodiscard]] Result<ClientStatistics> parse_statistics(std::string_view json);

}  // namespace kdedup::metrics
