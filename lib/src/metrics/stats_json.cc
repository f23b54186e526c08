#include "kdedup/metrics/stats_json.h"

#include <simdjson.h>

#include <algorithm>

namespace kdedup::metrics {
namespace {

using simdjson::dom::element;
using simdjson::dom::object;

Status type_error(const std::string& path, const char* expected) {
  return fail("librdkafka statistics: '" + path + "' is not " + expected);
}

// Reads an optional integer field: absent leaves `out` alone, any other
// type is an error naming the field's path.
Status read_int(object obj, std::string_view key, const std::string& path, std::int64_t& out) {
  element value;
  if (obj[key].get(value) != simdjson::SUCCESS) return {};
  if (value.get_int64().get(out) == simdjson::SUCCESS) return {};
  // librdkafka writes some counters as unsigned; accept those that fit.
  std::uint64_t u = 0;
  if (value.get_uint64().get(u) == simdjson::SUCCESS && u <= INT64_MAX) {
    out = static_cast<std::int64_t>(u);
    return {};
  }
  return type_error(path + std::string(key), "an integer");
}

Status read_string(object obj, std::string_view key, std::string& out) {
  element value;
  if (obj[key].get(value) != simdjson::SUCCESS) return {};
  std::string_view s;
  if (value.get_string().get(s) != simdjson::SUCCESS)
    return type_error(std::string(key), "a string");
  out.assign(s);
  return {};
}

Status read_topics(object root, ClientStatistics& out) {
  element topics_value;
  if (root["topics"].get(topics_value) != simdjson::SUCCESS) return {};
  object topics;
  if (topics_value.get_object().get(topics) != simdjson::SUCCESS) {
    return type_error("topics", "an object");
  }
  for (auto [topic_name, topic_value] : topics) {
    const std::string tpath = "topics." + std::string(topic_name) + ".";
    object topic;
    if (topic_value.get_object().get(topic) != simdjson::SUCCESS) {
      return type_error(tpath.substr(0, tpath.size() - 1), "an object");
    }
    element parts_value;
    if (topic["partitions"].get(parts_value) != simdjson::SUCCESS) continue;
    object parts;
    if (parts_value.get_object().get(parts) != simdjson::SUCCESS) {
      return type_error(tpath + "partitions", "an object");
    }
    for (auto [part_key, part_value] : parts) {
      const std::string ppath = tpath + "partitions." + std::string(part_key) + ".";
      object part;
      if (part_value.get_object().get(part) != simdjson::SUCCESS) {
        return type_error(ppath.substr(0, ppath.size() - 1), "an object");
      }
      std::int64_t id = -1, lag = -1, next = -1, app = -1;
      if (auto s = read_int(part, "partition", ppath, id); !s) return s;
      if (auto s = read_int(part, "consumer_lag", ppath, lag); !s) return s;
      if (auto s = read_int(part, "next_offset", ppath, next); !s) return s;
      if (auto s = read_int(part, "app_offset", ppath, app); !s) return s;
      // Logical offsets (negative) mean unknown.
      const std::int64_t unread = next >= 0 && app >= 0 && next > app ? next - app : 0;
      // -1 is librdkafka's internal unassigned (UA) partition; a lag of -1
      // means unknown (not consumed by this client, or nothing committed).
      if (id < 0 || id > INT32_MAX || (lag < 0 && unread == 0)) continue;
      out.lags.push_back(PartitionLag{std::string(topic_name), static_cast<std::int32_t>(id),
                                      std::max<std::int64_t>(lag, -1), unread});
    }
  }
  return {};
}

}  // namespace

Result<ClientStatistics> parse_statistics(std::string_view json) {
  simdjson::dom::parser parser;
  element doc;
  if (auto error = parser.parse(json.data(), json.size()).get(doc); error) {
    return fail(std::string("librdkafka statistics: malformed JSON: ") +
                simdjson::error_message(error));
  }
  object root;
  if (doc.get_object().get(root) != simdjson::SUCCESS) {
    return fail("librdkafka statistics: the document is not a JSON object");
  }
  ClientStatistics out;
  if (auto s = read_string(root, "name", out.name); !s) return tl::unexpected(s.error());
  if (auto s = read_string(root, "type", out.type); !s) return tl::unexpected(s.error());
  if (auto s = read_int(root, "ts", "", out.ts_us); !s) return tl::unexpected(s.error());
  if (auto s = read_int(root, "msg_cnt", "", out.msg_cnt); !s) return tl::unexpected(s.error());
  if (auto s = read_int(root, "msg_size", "", out.msg_size); !s) return tl::unexpected(s.error());

  element cgrp_value;
  if (root["cgrp"].get(cgrp_value) == simdjson::SUCCESS) {
    object cgrp;
    if (cgrp_value.get_object().get(cgrp) != simdjson::SUCCESS) {
      return fail("librdkafka statistics: 'cgrp' is not an object");
    }
    if (auto s = read_int(cgrp, "rebalance_cnt", "cgrp.", out.rebalance_cnt); !s) {
      return tl::unexpected(s.error());
    }
    if (auto s = read_int(cgrp, "assignment_size", "cgrp.", out.assignment_size); !s) {
      return tl::unexpected(s.error());
    }
  }

  if (auto s = read_topics(root, out); !s) return tl::unexpected(s.error());
  return out;
}

}  // namespace kdedup::metrics
