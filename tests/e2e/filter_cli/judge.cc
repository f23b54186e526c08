#include "judge.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace kdedup::testing {

std::string fmt_double(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (auto nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', start)) {
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

Verdict judge(const std::string& input, const std::string& output, std::int64_t window_ms,
              std::int64_t ticks) {
  Verdict v;
  const auto in = split_lines(input);
  const auto out = split_lines(output);
  std::unordered_map<std::int64_t, std::int64_t> last;  // id -> tick of its last delivery
  std::unordered_set<std::int64_t> dropped, fresh;      // ids falsely dropped; ids not delivered
  // Ids with a record not delivered since their last delivery.
  std::unordered_set<std::int64_t> asking;
  std::int64_t clock = 0;
  std::size_t o = 0;
  for (const auto& line : in) {
    const auto number = [&](const char* key) {
      const auto at = line.find(key) + std::strlen(key);
      return std::strtoll(line.c_str() + at, nullptr, 10);
    };
    const std::int64_t id = number("\"id\":"), ts = number("\"ts\":");
    clock = std::max(clock, ts);
    const std::int64_t tick = clock * ticks / window_ms;
    const auto it = last.find(id);
    const bool delivered = it != last.end() && tick - it->second <= ticks;
    const bool emitted = o < out.size() && out[o] == line;
    if (emitted) {
      ++o;
      ++v.emitted;
      v.false_negatives += delivered ? 1 : 0;
      last[id] = tick;
    } else if (!delivered) {
      ++v.false_positives;
      dropped.insert(id);
    }
    v.not_delivered += delivered ? 0 : 1;
    if (!delivered) {
      fresh.insert(id);
      if (asking.insert(id).second) {
        ++v.first_queries;
        v.first_query_false_positives += emitted ? 0 : 1;
      }
    }
    if (emitted) asking.erase(id);
  }
  v.identities_dropped = dropped.size();
  v.identities_new = fresh.size();
  EXPECT_EQ(o, out.size()) << "output is not the input's lines in order";
  return v;
}

}  // namespace kdedup::testing
