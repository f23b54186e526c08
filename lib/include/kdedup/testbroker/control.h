#pragma once
// The test broker's control channel: one command per line, one reply line per
// command, `ok ...` or `error <reason>`. Lines arrive on stdin or on the
// loopback control port of `kdedup testbroker`.
//
//   broker <id> down|up                    take a broker off the network / back
//   rtt <broker> <ms>                      delay the broker's responses
//   errors <Api> <count> <ErrCode>...      fail the next <count> <Api> requests
//                                          (codes repeat in order to fill count;
//                                          count 0 clears the Api's stack)
//   topic create <name> <partitions> [<replication>]
//   help | quit
//
// <Api> is a Kafka protocol request name (Produce, Fetch, OffsetCommit, ...)
// or its numeric ApiKey. <ErrCode> is a librdkafka error name as
// rd_kafka_err2name() prints it (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT,
// _TRANSPORT to drop the connection), optionally with the RD_KAFKA_RESP_ERR_
// prefix, or a number.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/testbroker/mock_cluster.h"

namespace kdedup::testbroker {

struct ControlCommand {
  enum class Kind { kBroker, kRtt, kErrors, kTopicCreate, kHelp, kQuit };
  Kind kind = Kind::kHelp;
  std::int32_t broker = 0;   ///< kBroker, kRtt
  bool up = false;           ///< kBroker
  int rtt_ms = 0;            ///< kRtt
  std::int16_t api_key = 0;  ///< kErrors
  std::vector<int> errors;   ///< kErrors: expanded to `count` codes; empty = clear
  std::string topic;         ///< kTopicCreate
  int partitions = 0;        ///< kTopicCreate
  int replication = 0;       ///< kTopicCreate; 0 = default
};

/// Parses one line. Errors name the offending word ("unknown command 'foo'").
[[nodiscard]] Result<ControlCommand> parse_control_command(std::string_view line);

/// Kafka ApiKey for a request name (case-insensitive) or a number.
[[nodiscard]] Result<std::int16_t> parse_api_key(std::string_view name);

/// librdkafka error code for a name as rd_kafka_err2name() prints it (with or
/// without the RD_KAFKA_RESP_ERR_ prefix, case-insensitive) or a number.
[[nodiscard]] Result<int> parse_error_code(std::string_view name);

/// Text of the `help` reply (one line).
[[nodiscard]] std::string control_help();

/// Executes control lines against one cluster. Owned by the thread that reads
/// the control inputs; not thread-safe.
class ControlChannel {
 public:
  explicit ControlChannel(MockCluster& cluster) : cluster_(cluster) {}

  /// Parses and runs one line; returns the reply line without a newline.
  /// Blank lines return an empty string (no reply).
  std::string execute(std::string_view line);

  /// True once a `quit` command was executed.
  [[nodiscard]] bool quit_requested() const noexcept { return quit_; }

 private:
  MockCluster& cluster_;
  bool quit_ = false;
};

}  // namespace kdedup::testbroker
