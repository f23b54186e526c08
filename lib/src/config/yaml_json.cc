// YAML -> JSON conversion for the config loader (see yaml_json.h).
//
// yaml-cpp reports every scalar as text; YAML 1.2's core schema decides what
// a plain (unquoted) scalar means: null, true/false, an integer or a float,
// otherwise a string. Quoted scalars are always strings. The original text of
// a plain scalar read as a non-string is kept so that a key the schema types
// as a string ("group_id: 123") gets exactly what was written.

#include "yaml_json.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <set>

#include <yaml-cpp/yaml.h>

namespace kdedup::config::detail {
namespace {

bool is_librdkafka_map(std::string_view name) {
  return name == "kafka" || name == "consumer" || name == "producer";
}

std::string location(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

/// YAML 1.2 core schema resolution of a plain scalar.
Json resolve_plain(const std::string& text) {
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return Json(nullptr);
  }
  if (text == "true" || text == "True" || text == "TRUE") return Json(true);
  if (text == "false" || text == "False" || text == "FALSE") return Json(false);
  if (text.size() > 64) return Json(text);
  auto all_of = [](std::string_view t, auto pred) {
    return !t.empty() && std::all_of(t.begin(), t.end(),
                                     [&](char c) { return pred(static_cast<unsigned char>(c)); });
  };
  std::string_view body = text;
  if (body.front() == '+' || body.front() == '-') body.remove_prefix(1);
  if (all_of(body, ::isdigit)) {
    std::string_view digits = text;
    if (digits.front() == '+') digits.remove_prefix(1);
    std::int64_t value = 0;
    auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec == std::errc() && p == digits.data() + digits.size()) return Json(value);
    std::uint64_t uvalue = 0;
    auto [up, uec] = std::from_chars(digits.data(), digits.data() + digits.size(), uvalue);
    if (uec == std::errc() && up == digits.data() + digits.size()) return Json(uvalue);
    return Json(text);  // out of range: the schema will say it is not a number
  }
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'o')) {
    int base = text[1] == 'x' ? 16 : 8;
    std::string_view rest = std::string_view(text).substr(2);
    bool ok = base == 16 ? all_of(rest, ::isxdigit)
                         : all_of(rest, [](int c) { return c >= '0' && c <= '7'; });
    std::uint64_t value = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value, base);
    if (ok && ec == std::errc() && p == rest.data() + rest.size()) return Json(value);
    return Json(text);
  }
  // Floats: [-+]?(.digits|digits[.digits?])([eE][-+]?digits)?
  std::size_t k = 0;
  std::size_t int_digits = 0, frac_digits = 0;
  while (k < body.size() && std::isdigit(static_cast<unsigned char>(body[k]))) ++k, ++int_digits;
  if (k < body.size() && body[k] == '.') {
    ++k;
    while (k < body.size() && std::isdigit(static_cast<unsigned char>(body[k]))) ++k, ++frac_digits;
  }
  bool mantissa = int_digits > 0 || frac_digits > 0;
  if (mantissa && k < body.size() && (body[k] == 'e' || body[k] == 'E')) {
    ++k;
    if (k < body.size() && (body[k] == '+' || body[k] == '-')) ++k;
    std::size_t exp_digits = 0;
    while (k < body.size() && std::isdigit(static_cast<unsigned char>(body[k]))) ++k, ++exp_digits;
    if (exp_digits == 0) mantissa = false;
  }
  if (mantissa && k == body.size()) {
    char* end = nullptr;
    double value = std::strtod(text.c_str(), &end);
    if (end == text.c_str() + text.size() && std::isfinite(value)) return Json(value);
  }
  return Json(text);
}

/// Converts one YAML node tree; shared state of one conversion.
class Converter {
 public:
  Converter(std::string source, const EnvLookup* env, Document& doc, std::vector<Issue>& errors)
      : source_(std::move(source)), env_(env), doc_(doc), errors_(errors) {}

  Json convert(const YAML::Node& node, KeyPath& path, int depth) {
    if (++nodes_ > kMaxNodes) {
      if (!budget_reported_) {
        error(path,
              "the document has more than " + std::to_string(kMaxNodes) +
                  " values (aliases expanded); a kdedup config is far smaller",
              node.Mark());
        budget_reported_ = true;
      }
      return Json(nullptr);
    }
    if (depth > kMaxDepth) {
      error(path, "nested deeper than " + std::to_string(kMaxDepth) + " levels", node.Mark());
      return Json(nullptr);
    }
    doc_.where[pointer(path)] = location(source_, node.Mark());
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        return Json(nullptr);
      case YAML::NodeType::Scalar:
        return scalar(node, path);
      case YAML::NodeType::Sequence: {
        Json out = Json::array();
        std::size_t i = 0;
        for (const auto& item : node) {
          path.push_back(std::to_string(i++));
          out.push_back(convert(item, path, depth + 1));
          path.pop_back();
        }
        return out;
      }
      case YAML::NodeType::Map: {
        Json out = Json::object();
        for (const auto& kv : node) {
          if (!kv.first.IsScalar()) {
            error(path, "a key must be a plain name, not a list or map", kv.first.Mark());
            continue;
          }
          std::string key = kv.first.Scalar();
          path.push_back(key);
          if (out.contains(key)) {
            error(path, "duplicate key (it is set twice in this map)", kv.first.Mark());
          } else {
            doc_.key_where[pointer(path)] = location(source_, kv.first.Mark());
            out[key] = convert(kv.second, path, depth + 1);
          }
          path.pop_back();
        }
        return out;
      }
    }
    return Json(nullptr);
  }

 private:
  Json scalar(const YAML::Node& node, const KeyPath& path) {
    std::string text = node.Scalar();
    bool interpolated = false;
    if (env_ != nullptr && text.find('$') != std::string::npos) {
      auto value = interpolate(text, *env_);
      if (!value) {
        error(path, value.error().message, node.Mark());
        return Json(text);
      }
      interpolated = *value != text;
      text = std::move(*value);
    }
    // Tag "!" marks a quoted (non-plain) scalar: always a string.
    if (node.Tag() == "!") return Json(text);
    if (interpolated && text.empty()) return Json(std::string());
    Json value = resolve_plain(text);
    if (!value.is_string()) doc_.plain_text[pointer(path)] = text;
    return value;
  }

  void error(const KeyPath& path, std::string message, const YAML::Mark& mark) {
    errors_.push_back(Issue{dotted(path), std::move(message), location(source_, mark)});
  }

  std::string source_;
  const EnvLookup* env_;
  Document& doc_;
  std::vector<Issue>& errors_;
  std::size_t nodes_ = 0;
  bool budget_reported_ = false;
};

bool valid_var_name(std::string_view name) {
  if (name.empty()) return false;
  if (!(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

/// Erases side-table entries at or below `ptr` (a value being replaced).
void erase_below(std::map<std::string, std::string>& table, const std::string& ptr) {
  for (auto it = table.lower_bound(ptr); it != table.end();) {
    if (it->first == ptr ||
        (it->first.size() > ptr.size() && it->first.compare(0, ptr.size(), ptr) == 0 &&
         it->first[ptr.size()] == '/')) {
      it = table.erase(it);
    } else if (it->first.compare(0, ptr.size(), ptr) == 0) {
      ++it;
    } else {
      break;
    }
  }
}

}  // namespace

std::string dotted(const KeyPath& path, const Json* root) {
  std::string out;
  const Json* node = root;
  for (const auto& part : path) {
    bool index = node != nullptr && node->is_array();
    if (index) {
      out += "[" + part + "]";
    } else {
      if (!out.empty()) out += '.';
      out += part;
    }
    if (node != nullptr) {
      if (node->is_object() && node->contains(part)) {
        node = &(*node)[part];
      } else if (node->is_array()) {
        std::size_t i = std::strtoull(part.c_str(), nullptr, 10);
        node = i < node->size() ? &(*node)[i] : nullptr;
      } else {
        node = nullptr;
      }
    }
  }
  return out;
}

std::string pointer(const KeyPath& path) {
  std::string out;
  for (const auto& part : path) {
    out += '/';
    for (char c : part) {
      if (c == '~') {
        out += "~0";
      } else if (c == '/') {
        out += "~1";
      } else {
        out += c;
      }
    }
  }
  return out;
}

Result<std::string> interpolate(std::string_view text, const EnvLookup& env) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
      continue;
    }
    if (text.compare(i, 2, "${") != 0) {
      out += text[i++];
      continue;
    }
    std::size_t close = text.find('}', i + 2);
    if (close == std::string_view::npos) {
      return fail("unterminated '${' in '" + std::string(text) + "' (write $${ for a literal ${)");
    }
    std::string_view body = text.substr(i + 2, close - i - 2);
    std::string_view name = body;
    std::optional<std::string_view> fallback;
    if (auto sep = body.find(":-"); sep != std::string_view::npos) {
      name = body.substr(0, sep);
      fallback = body.substr(sep + 2);
    }
    if (!valid_var_name(name)) {
      return fail("'${" + std::string(body) +
                  "}' is not a variable reference: use ${NAME} or ${NAME:-default} with NAME "
                  "made of letters, digits and '_'");
    }
    auto value = env(std::string(name));
    if (value) {
      out += *value;
    } else if (fallback) {
      out += *fallback;
    } else {
      return fail("environment variable " + std::string(name) +
                  " is not set (give a default with ${" + std::string(name) + ":-value})");
    }
    i = close + 1;
  }
  return out;
}

bool parse_yaml_document(std::string_view text, const std::string& source, const EnvLookup& env,
                         Document& doc, std::vector<Issue>& errors) {
  if (text.size() > kMaxFileBytes) {
    errors.push_back(Issue{"",
                           "file is larger than " + std::to_string(kMaxFileBytes >> 20) +
                               " MiB; a kdedup config is far smaller",
                           source});
    return false;
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    errors.push_back(Issue{"", "YAML syntax error: " + e.msg, location(source, e.mark)});
    return false;
  } catch (const std::exception& e) {
    errors.push_back(Issue{"", std::string("cannot parse YAML: ") + e.what(), source});
    return false;
  }
  if (!root.IsDefined() || root.IsNull()) {
    errors.push_back(Issue{
        "", "the file is empty; expected a map of settings (see config/kdedup.yaml)", source});
    return false;
  }
  if (!root.IsMap()) {
    errors.push_back(Issue{"", "the top level must be a map of settings (key: value)",
                           location(source, root.Mark())});
    return false;
  }
  try {
    Converter converter(source, &env, doc, errors);
    KeyPath path;
    doc.root = converter.convert(root, path, 0);
  } catch (const std::exception& e) {
    errors.push_back(Issue{"", std::string("cannot read YAML: ") + e.what(), source});
    return false;
  }
  return true;
}

bool may_hold_secret(const KeyPath& path) {
  if (path.empty()) return true;
  if (path[0] == "identity") return path.size() == 1 || path[1] == "salt";
  if (is_librdkafka_map(path[0])) return path.size() == 1 || is_secret_property(path[1]);
  return false;
}

void apply_override(std::string_view assignment, Document& doc, std::vector<Issue>& errors) {
  std::string where = "--set " + std::string(assignment);
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    errors.push_back(Issue{"", "expected key.path=value", where});
    return;
  }
  std::string_view key = assignment.substr(0, eq);
  std::string value_text(assignment.substr(eq + 1));

  // Split the key path; inside kafka/consumer/producer the rest of the path
  // is one librdkafka property name, which contains dots itself.
  KeyPath path;
  std::size_t start = 0;
  while (true) {
    if (!path.empty() && is_librdkafka_map(path.front()) && path.size() == 1) {
      path.emplace_back(key.substr(start));
      break;
    }
    auto dot = key.find('.', start);
    path.emplace_back(key.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  // The location names the flag; a secret's value stays out of it.
  if (may_hold_secret(path)) where = "--set " + std::string(key) + "=" + kHiddenValue;
  for (const auto& part : path) {
    if (part.empty()) {
      errors.push_back(Issue{std::string(key), "empty component in key path", where});
      return;
    }
  }

  Json value;
  std::map<std::string, std::string> plain;
  if (value_text.empty()) {
    value = std::string();
  } else {
    Document parsed;
    std::vector<Issue> parse_errors;
    YAML::Node node;
    try {
      node = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      errors.push_back(Issue{std::string(key), "value is not valid YAML: " + e.msg, where});
      return;
    }
    try {
      Converter converter(where, nullptr, parsed, parse_errors);
      KeyPath inner;
      value = converter.convert(node, inner, 0);
    } catch (const std::exception& e) {
      errors.push_back(
          Issue{std::string(key), std::string("cannot read value: ") + e.what(), where});
      return;
    }
    for (auto& issue : parse_errors) {
      issue.path = std::string(key) + (issue.path.empty() ? "" : "." + issue.path);
      errors.push_back(std::move(issue));
    }
    plain = std::move(parsed.plain_text);
  }

  if (!doc.root.is_object()) doc.root = Json::object();
  Json* node = &doc.root;
  for (std::size_t i = 0; i + 1 < path.size(); ++i) {
    Json& child = (*node)[path[i]];
    if (child.is_null()) child = Json::object();
    if (!child.is_object()) {
      KeyPath prefix(path.begin(), path.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      errors.push_back(Issue{dotted(prefix),
                             std::string("is a ") + (child.is_array() ? "list" : "single value") +
                                 ", not a map: --set it whole (e.g. --set input.topics=[a,b])",
                             where});
      return;
    }
    node = &child;
  }
  (*node)[path.back()] = std::move(value);
  const std::string ptr = pointer(path);
  erase_below(doc.where, ptr);
  erase_below(doc.plain_text, ptr);
  erase_below(doc.key_where, ptr);
  doc.where[ptr] = where;
  for (auto& [inner_ptr, text] : plain) doc.plain_text[ptr + inner_ptr] = text;
}

}  // namespace kdedup::config::detail
