#include "kdedup/testbroker/control.h"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>

#include <fmt/format.h>

namespace kdedup::testbroker {

namespace {

// Kafka protocol request names by ApiKey (the Kafka protocol guide's table).
constexpr std::array<std::string_view, 61> kApiNames = {"Produce",
                                                        "Fetch",
                                                        "ListOffsets",
                                                        "Metadata",
                                                        "LeaderAndIsr",
                                                        "StopReplica",
                                                        "UpdateMetadata",
                                                        "ControlledShutdown",
                                                        "OffsetCommit",
                                                        "OffsetFetch",
                                                        "FindCoordinator",
                                                        "JoinGroup",
                                                        "Heartbeat",
                                                        "LeaveGroup",
                                                        "SyncGroup",
                                                        "DescribeGroups",
                                                        "ListGroups",
                                                        "SaslHandshake",
                                                        "ApiVersions",
                                                        "CreateTopics",
                                                        "DeleteTopics",
                                                        "DeleteRecords",
                                                        "InitProducerId",
                                                        "OffsetForLeaderEpoch",
                                                        "AddPartitionsToTxn",
                                                        "AddOffsetsToTxn",
                                                        "EndTxn",
                                                        "WriteTxnMarkers",
                                                        "TxnOffsetCommit",
                                                        "DescribeAcls",
                                                        "CreateAcls",
                                                        "DeleteAcls",
                                                        "DescribeConfigs",
                                                        "AlterConfigs",
                                                        "AlterReplicaLogDirs",
                                                        "DescribeLogDirs",
                                                        "SaslAuthenticate",
                                                        "CreatePartitions",
                                                        "CreateDelegationToken",
                                                        "RenewDelegationToken",
                                                        "ExpireDelegationToken",
                                                        "DescribeDelegationToken",
                                                        "DeleteGroups",
                                                        "ElectLeaders",
                                                        "IncrementalAlterConfigs",
                                                        "AlterPartitionReassignments",
                                                        "ListPartitionReassignments",
                                                        "OffsetDelete",
                                                        "DescribeClientQuotas",
                                                        "AlterClientQuotas",
                                                        "DescribeUserScramCredentials",
                                                        "AlterUserScramCredentials",
                                                        "Vote",
                                                        "BeginQuorumEpoch",
                                                        "EndQuorumEpoch",
                                                        "DescribeQuorum",
                                                        "AlterPartition",
                                                        "UpdateFeatures",
                                                        "Envelope",
                                                        "FetchSnapshot",
                                                        "DescribeCluster"};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    std::size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

template <class T>
Result<T> parse_int(std::string_view word, std::string_view what, T min, T max) {
  T value{};
  auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  if (ec != std::errc() || ptr != word.data() + word.size()) {
    return fail(fmt::format("{}: '{}' is not an integer", what, word));
  }
  if (value < min || value > max) {
    return fail(fmt::format("{}: {} is out of range ({}..{})", what, value, min, max));
  }
  return value;
}

constexpr std::string_view kUsage =
    "commands: broker <id> down|up; rtt <broker> <ms>; errors <Api> <count> <ErrCode>...; "
    "topic create <name> <partitions> [<replication>]; help; quit";

}  // namespace

std::string control_help() { return std::string(kUsage); }

Result<std::int16_t> parse_api_key(std::string_view name) {
  if (!name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
    return parse_int<std::int16_t>(name, "ApiKey", 0, 1000);
  }
  for (std::size_t i = 0; i < kApiNames.size(); ++i) {
    if (iequals(kApiNames[i], name)) return static_cast<std::int16_t>(i);
  }
  return fail(fmt::format(
      "unknown Kafka API '{}' (e.g. Produce, Fetch, OffsetCommit, or an ApiKey number)", name));
}

Result<int> parse_error_code(std::string_view name) {
  if (!name.empty() && (std::isdigit(static_cast<unsigned char>(name[0])) || name[0] == '-')) {
    return parse_int<int>(name, "error code", -200, 1000);
  }
  constexpr std::string_view kPrefix = "RD_KAFKA_RESP_ERR_";
  if (name.size() > kPrefix.size() && iequals(name.substr(0, kPrefix.size()), kPrefix)) {
    name.remove_prefix(kPrefix.size());
  }
  // Current Kafka names that librdkafka 2.0.2 still lists under older names.
  static constexpr std::pair<std::string_view, int> kAliases[] = {
      {"NOT_LEADER_OR_FOLLOWER", RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION},
      {"GROUP_LOAD_IN_PROGRESS", RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS},
      {"GROUP_COORDINATOR_NOT_AVAILABLE", RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE},
      {"NOT_COORDINATOR_FOR_GROUP", RD_KAFKA_RESP_ERR_NOT_COORDINATOR}};
  for (const auto& [alias, code] : kAliases) {
    if (iequals(alias, name)) return code;
  }
  const rd_kafka_err_desc* descs = nullptr;
  std::size_t count = 0;
  rd_kafka_get_err_descs(&descs, &count);
  for (std::size_t i = 0; i < count; ++i) {
    if (descs[i].name && iequals(descs[i].name, name)) return static_cast<int>(descs[i].code);
  }
  return fail(
      fmt::format("unknown error code '{}' (use names as rd_kafka_err2name prints them, "
                  "e.g. NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT)",
                  name));
}

Result<ControlCommand> parse_control_command(std::string_view line) {
  auto w = split_words(line);
  if (w.empty()) return fail("empty command");
  ControlCommand c;
  auto arity = [&](std::size_t min, std::size_t max, std::string_view usage) -> Status {
    if (w.size() < min || w.size() > max) return fail(fmt::format("usage: {}", usage));
    return {};
  };
  const std::string_view verb = w[0];
  if (iequals(verb, "help")) {
    c.kind = ControlCommand::Kind::kHelp;
    return c;
  }
  if (iequals(verb, "quit")) {
    c.kind = ControlCommand::Kind::kQuit;
    return c;
  }
  if (iequals(verb, "broker")) {
    if (auto ok = arity(3, 3, "broker <id> down|up"); !ok) return tl::unexpected(ok.error());
    auto id = parse_int<std::int32_t>(w[1], "broker id", 1, 1000);
    if (!id) return tl::unexpected(id.error());
    c.kind = ControlCommand::Kind::kBroker;
    c.broker = *id;
    if (iequals(w[2], "down")) {
      c.up = false;
    } else if (iequals(w[2], "up")) {
      c.up = true;
    } else {
      return fail(fmt::format("broker: expected 'down' or 'up', got '{}'", w[2]));
    }
    return c;
  }
  if (iequals(verb, "rtt")) {
    if (auto ok = arity(3, 3, "rtt <broker> <ms>"); !ok) return tl::unexpected(ok.error());
    auto id = parse_int<std::int32_t>(w[1], "broker id", 1, 1000);
    if (!id) return tl::unexpected(id.error());
    auto ms = parse_int<int>(w[2], "rtt ms", 0, 600'000);
    if (!ms) return tl::unexpected(ms.error());
    c.kind = ControlCommand::Kind::kRtt;
    c.broker = *id;
    c.rtt_ms = *ms;
    return c;
  }
  if (iequals(verb, "errors")) {
    if (w.size() < 3) return fail("usage: errors <Api> <count> <ErrCode>...");
    auto api = parse_api_key(w[1]);
    if (!api) return tl::unexpected(api.error());
    auto count = parse_int<std::size_t>(w[2], "errors count", 0, 100'000);
    if (!count) return tl::unexpected(count.error());
    std::vector<int> codes;
    for (std::size_t i = 3; i < w.size(); ++i) {
      auto code = parse_error_code(w[i]);
      if (!code) return tl::unexpected(code.error());
      codes.push_back(*code);
    }
    if (*count > 0 && codes.empty()) return fail("errors: give at least one error code");
    c.kind = ControlCommand::Kind::kErrors;
    c.api_key = *api;
    for (std::size_t i = 0; i < *count; ++i) c.errors.push_back(codes[i % codes.size()]);
    return c;
  }
  if (iequals(verb, "topic")) {
    if (w.size() < 2 || !iequals(w[1], "create")) {
      return fail("usage: topic create <name> <partitions> [<replication>]");
    }
    if (auto ok = arity(4, 5, "topic create <name> <partitions> [<replication>]"); !ok) {
      return tl::unexpected(ok.error());
    }
    auto parts = parse_int<int>(w[3], "partitions", 1, 10000);
    if (!parts) return tl::unexpected(parts.error());
    c.kind = ControlCommand::Kind::kTopicCreate;
    c.topic = std::string(w[2]);
    c.partitions = *parts;
    if (w.size() == 5) {
      auto repl = parse_int<int>(w[4], "replication", 1, 1000);
      if (!repl) return tl::unexpected(repl.error());
      c.replication = *repl;
    }
    return c;
  }
  return fail(fmt::format("unknown command '{}' (try 'help')", verb));
}

std::string ControlChannel::execute(std::string_view line) {
  if (split_words(line).empty()) return {};
  auto cmd = parse_control_command(line);
  if (!cmd) return "error " + cmd.error().message;
  Status st;
  std::string ok;
  switch (cmd->kind) {
    case ControlCommand::Kind::kHelp:
      return "ok " + control_help();
    case ControlCommand::Kind::kQuit:
      quit_ = true;
      return "ok quitting";
    case ControlCommand::Kind::kBroker:
      st = cluster_.set_broker_up(cmd->broker, cmd->up);
      ok = fmt::format("broker {} {}", cmd->broker, cmd->up ? "up" : "down");
      break;
    case ControlCommand::Kind::kRtt:
      st = cluster_.set_rtt(cmd->broker, cmd->rtt_ms);
      ok = fmt::format("broker {} rtt {} ms", cmd->broker, cmd->rtt_ms);
      break;
    case ControlCommand::Kind::kErrors:
      cluster_.push_request_errors(cmd->api_key, cmd->errors);
      ok = cmd->errors.empty() ? fmt::format("errors cleared for ApiKey {}", cmd->api_key)
                               : fmt::format("next {} requests of ApiKey {} will fail",
                                             cmd->errors.size(), cmd->api_key);
      break;
    case ControlCommand::Kind::kTopicCreate:
      st = cluster_.create_topic(cmd->topic, cmd->partitions, cmd->replication);
      ok = fmt::format("topic {} created with {} partitions", cmd->topic, cmd->partitions);
      break;
  }
  if (!st) return "error " + st.error().message;
  return "ok " + ok;
}

}  // namespace kdedup::testbroker
