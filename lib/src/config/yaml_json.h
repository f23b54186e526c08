#pragma once
// Internal to kdedup::config: turns YAML (file text or a --set value) into a
// JSON document the schema can validate, interpolating ${VAR} on the way and
// remembering where each value came from so errors can point at it.

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kdedup/config/config.h"

namespace kdedup::config::detail {

using Json = nlohmann::json;

/// A key path: object keys and array indices (as decimal text) from the root.
using KeyPath = std::vector<std::string>;

/// "filter.fpp", "input.topics[1]", "kafka.bootstrap.servers".
std::string dotted(const KeyPath& path, const Json* root = nullptr);

/// RFC 6901 pointer text of a path, the key of Document's side tables.
std::string pointer(const KeyPath& path);

/// The converted document and what the loader knows about each value.
struct Document {
  Json root;
  /// pointer -> "file:line:column" (or "--set") of the value.
  std::map<std::string, std::string> where;
  /// pointer -> "file:line:column" of the key naming the value (maps only).
  std::map<std::string, std::string> key_where;
  /// pointer -> original text of plain (unquoted) scalars that were read as
  /// a number, boolean or null, so string-typed keys can take them back
  /// verbatim ("group_id: 123", "linger.ms: 5").
  std::map<std::string, std::string> plain_text;
};

/// Limits that keep a hostile or broken file from exhausting the process
/// (alias expansion "billion laughs", deep nesting).
inline constexpr std::size_t kMaxNodes = 100'000;
inline constexpr int kMaxDepth = 64;
inline constexpr std::size_t kMaxFileBytes = 4u << 20;

/// Replaces ${VAR} and ${VAR:-default}; "$${" is a literal "${". The error
/// names the variable (the caller adds the key path).
[[nodiscard]] Result<std::string> interpolate(std::string_view text, const EnvLookup& env);

/// Parses YAML text into `doc`; every problem is appended to `errors`.
/// Returns false when the text could not be parsed at all.
bool parse_yaml_document(std::string_view text, const std::string& source, const EnvLookup& env,
                         Document& doc, std::vector<Issue>& errors);

/// What error messages print instead of a secret's value.
inline constexpr const char* kHiddenValue = "(value hidden)";

/// True when the value at `path` is, or may contain, a secret whose value no
/// message may print: identity.salt, a librdkafka property for which
/// is_secret_property() holds, and the maps above them (the root, identity,
/// kafka, consumer, producer), whose dump would include them.
[[nodiscard]] bool may_hold_secret(const KeyPath& path);

/// Applies one "key.path=value" override to `doc`.
void apply_override(std::string_view assignment, Document& doc, std::vector<Issue>& errors);

}  // namespace kdedup::config::detail
