// The JSON Schema passes of config loading (schema_check.h).

#include "schema_check.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include "schema_embed.h"

namespace kdedup::config::detail {

const Json& schema_document() {
  static const Json doc = Json::parse(kConfigSchema);
  return doc;
}

namespace {

/// Resolves "#/definitions/x" references and single-element allOf wrappers
/// so schema walks see the effective object/array/string schema.
const Json* resolve(const Json* schema) {
  for (int guard = 0; schema != nullptr && guard < 16; ++guard) {
    if (schema->contains("$ref")) {
      std::string ref = (*schema)["$ref"].get<std::string>();
      if (ref.rfind("#/", 0) != 0) return schema;
      schema = &schema_document()[Json::json_pointer(ref.substr(1))];
    } else if (schema->contains("allOf") && !schema->contains("type") &&
               !schema->contains("properties")) {
      schema = &(*schema)["allOf"][0];
    } else {
      return schema;
    }
  }
  return schema;
}

bool has_type(const Json& schema, const char* type) {
  if (!schema.contains("type")) return false;
  const Json& t = schema["type"];
  if (t.is_string()) return t.get<std::string>() == type;
  return std::find(t.begin(), t.end(), Json(type)) != t.end();
}

/// Schema of a child value: properties[key], else additionalProperties (when
/// it is a schema), else items for arrays.
const Json* child_schema(const Json* schema, const std::string& key, bool in_array) {
  if (schema == nullptr) return nullptr;
  if (in_array) return schema->contains("items") ? resolve(&(*schema)["items"]) : nullptr;
  if (schema->contains("properties") && (*schema)["properties"].contains(key)) {
    return resolve(&(*schema)["properties"][key]);
  }
  if (schema->contains("additionalProperties") && (*schema)["additionalProperties"].is_object()) {
    return resolve(&(*schema)["additionalProperties"]);
  }
  return nullptr;
}

/// Levenshtein distance, for "did you mean" on unknown keys.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// Walks document and schema together: gives plain scalars back their text
/// where the schema wants a string, turns an empty section (null) into {},
/// and reports unknown keys with a suggestion.
class SchemaWalk {
 public:
  SchemaWalk(Document& doc, std::vector<Issue>& errors) : doc_(doc), errors_(errors) {}

  void run() {
    KeyPath path;
    walk(doc_.root, resolve(&schema_document()), path);
  }

 private:
  void walk(Json& value, const Json* schema, KeyPath& path) {
    if (schema == nullptr) return;
    const std::string ptr = pointer(path);
    if (value.is_null() && has_type(*schema, "object") && !has_type(*schema, "null")) {
      value = Json::object();
    }
    if (has_type(*schema, "string") && !value.is_string() && !value.is_object() &&
        !value.is_array()) {
      auto it = doc_.plain_text.find(ptr);
      if (it != doc_.plain_text.end() && (!value.is_null() || has_type(*schema, "string"))) {
        // Null in a string key means "nothing": an empty string.
        value = value.is_null() ? std::string() : it->second;
        doc_.plain_text.erase(it);
      }
    }
    if (value.is_object()) {
      bool closed = schema->contains("additionalProperties") &&
                    (*schema)["additionalProperties"].is_boolean() &&
                    !(*schema)["additionalProperties"].get<bool>();
      for (auto& [key, child] : value.items()) {
        path.push_back(key);
        const Json* sub = child_schema(schema, key, false);
        if (sub == nullptr && closed) {
          unknown_key(*schema, key, path);
        } else {
          walk(child, sub, path);
        }
        path.pop_back();
      }
    } else if (value.is_array()) {
      for (std::size_t i = 0; i < value.size(); ++i) {
        path.push_back(std::to_string(i));
        walk(value[i], child_schema(schema, "", true), path);
        path.pop_back();
      }
    }
  }

  void unknown_key(const Json& schema, const std::string& key, const KeyPath& path) {
    std::string message = "unknown key";
    std::string best;
    std::size_t best_distance = 3;
    std::vector<std::string> allowed;
    if (schema.contains("properties")) {
      for (auto& [name, sub] : schema["properties"].items()) {
        allowed.push_back(name);
        std::size_t d = edit_distance(key, name);
        if (d < best_distance) {
          best_distance = d;
          best = name;
        }
      }
    }
    if (!best.empty()) {
      message += " (did you mean '" + best + "'?)";
    } else if (!allowed.empty()) {
      std::string list;
      for (const auto& name : allowed) list += (list.empty() ? "" : ", ") + name;
      message += "; allowed here: " + list;
    }
    errors_.push_back(Issue{dotted(path, &doc_.root), message, where(path)});
  }

  std::string where(const KeyPath& path) const {
    auto it = doc_.key_where.find(pointer(path));
    if (it != doc_.key_where.end()) return it->second;
    it = doc_.where.find(pointer(path));
    return it == doc_.where.end() ? "" : it->second;
  }

  Document& doc_;
  std::vector<Issue>& errors_;
};

/// Context "[filter]" -> "filter"; valijson paths start with "<root>".
KeyPath context_path(const std::vector<std::string>& context) {
  KeyPath path;
  for (const auto& part : context) {
    if (part == "<root>") continue;
    if (part.size() >= 2 && part.front() == '[' && part.back() == ']') {
      std::string inner = part.substr(1, part.size() - 2);
      if (inner.size() >= 2 && inner.front() == '"' && inner.back() == '"') {
        inner = inner.substr(1, inner.size() - 2);
      }
      path.push_back(inner);
    } else {
      path.push_back(part);
    }
  }
  return path;
}

/// The (resolved) schema of the value at `path`, or nullptr.
const Json* schema_at(const KeyPath& path, const Json& root) {
  const Json* schema = resolve(&schema_document());
  const Json* node = &root;
  for (const auto& part : path) {
    bool in_array = node != nullptr && node->is_array();
    schema = child_schema(schema, part, in_array);
    if (node != nullptr) {
      if (node->is_object() && node->contains(part)) {
        node = &(*node)[part];
      } else if (in_array) {
        std::size_t i = std::strtoull(part.c_str(), nullptr, 10);
        node = i < node->size() ? &(*node)[i] : nullptr;
      } else {
        node = nullptr;
      }
    }
    if (schema == nullptr) return nullptr;
  }
  return schema;
}

const Json* value_at(const KeyPath& path, const Json& root) {
  const Json* node = &root;
  for (const auto& part : path) {
    if (node->is_object() && node->contains(part)) {
      node = &(*node)[part];
    } else if (node->is_array()) {
      std::size_t i = std::strtoull(part.c_str(), nullptr, 10);
      if (i >= node->size()) return nullptr;
      node = &(*node)[i];
    } else {
      return nullptr;
    }
  }
  return node;
}

const char* json_kind(const Json& v) {
  if (v.is_null()) return "nothing";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "a map";
}

/// Turns valijson's generic wording into a message that says what was given
/// and what is allowed, using the schema at the path.
std::string explain(const std::string& description, const KeyPath& path, const Json& root) {
  const Json* schema = schema_at(path, root);
  const Json* value = value_at(path, root);
  if (schema == nullptr || value == nullptr) return description;
  std::string given = value->is_string() ? "'" + value->get<std::string>() + "'" : value->dump();
  if (given.size() > 80) given = given.substr(0, 77) + "...";
  if (detail::may_hold_secret(path)) given = detail::kHiddenValue;
  if (description.find("enum") != std::string::npos && schema->contains("enum")) {
    std::string allowed;
    for (const auto& e : (*schema)["enum"])
      allowed += (allowed.empty() ? "" : ", ") + (e.is_string() ? e.get<std::string>() : e.dump());
    return given + " is not allowed; use one of: " + allowed;
  }
  if (description.find("pattern") != std::string::npos) {
    std::string what =
        schema->contains("description") ? (*schema)["description"].get<std::string>() : "";
    return given + " is not valid" + (what.empty() ? "" : ": " + what);
  }
  if (description.find("'type' constraint") != std::string::npos && schema->contains("type")) {
    const Json& t = (*schema)["type"];
    std::string want = t.is_string() ? t.get<std::string>() : t.dump();
    if (want == "object") want = "map";
    if (want == "array") want = "list";
    return "expected a " + want + ", got " + json_kind(*value) + " (" + given + ")";
  }
  if (description.rfind("Expected ", 0) == 0 || description.find("length") != std::string::npos ||
      description.find("items") != std::string::npos) {
    return given + ": " + description;
  }
  return description;
}

bool is_prefix(const KeyPath& a, const KeyPath& b) {
  return a.size() < b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

/// Runs valijson and keeps the most specific errors (a failure of a nested
/// value is also reported for each parent; those add nothing).
void validate_schema(const Document& doc, std::vector<Issue>& errors) {
  static const valijson::Schema* schema = [] {
    auto* s = new valijson::Schema();  // lives for the process: read-only after init
    valijson::SchemaParser parser;
    valijson::adapters::NlohmannJsonAdapter adapter(schema_document());
    parser.populateSchema(adapter, *s);
    return s;
  }();
  valijson::Validator validator;
  valijson::ValidationResults results;
  valijson::adapters::NlohmannJsonAdapter target(doc.root);
  if (validator.validate(*schema, target, &results)) return;

  std::vector<std::pair<KeyPath, std::string>> found;
  valijson::ValidationResults::Error e;
  while (results.popError(e)) {
    // Unknown keys were reported by SchemaWalk with a suggestion.
    if (e.description.find("could not be validated using 'properties'") != std::string::npos) {
      continue;
    }
    if (e.description.find("Failed to validate against") != std::string::npos ||
        e.description.find("Failed to validate item") != std::string::npos ||
        e.description.find("Failed to validate value against any") != std::string::npos) {
      // Summaries of nested failures; keep only when nothing more specific exists.
      found.emplace_back(context_path(e.context), "#summary#" + e.description);
      continue;
    }
    const std::string kMissing = "Missing required property '";
    if (e.description.rfind(kMissing, 0) == 0) {
      // Report a missing key at its own path, where a user looks for it.
      KeyPath path = context_path(e.context);
      std::string key = e.description.substr(kMissing.size());
      path.push_back(key.substr(0, key.find('\'')));
      found.emplace_back(path, "#missing#");
      continue;
    }
    found.emplace_back(context_path(e.context), e.description);
  }
  std::set<std::pair<KeyPath, std::string>> seen;
  for (const auto& [path, description] : found) {
    bool summary = description.rfind("#summary#", 0) == 0;
    bool shadowed = false;
    for (const auto& [other, other_desc] : found) {
      bool other_summary = other_desc.rfind("#summary#", 0) == 0;
      if (summary && (is_prefix(path, other) || (other == path && !other_summary))) {
        shadowed = true;
        break;
      }
    }
    if (shadowed || !seen.insert({path, description}).second) continue;
    if (description == "#missing#") {
      KeyPath parent(path.begin(), path.end() - 1);
      auto it = doc.key_where.find(pointer(parent));
      errors.push_back(Issue{dotted(path, &doc.root), "required key is missing",
                             it == doc.key_where.end() ? "" : it->second});
      continue;
    }
    std::string text = summary ? description.substr(9) : explain(description, path, doc.root);
    auto it = doc.where.find(pointer(path));
    errors.push_back(Issue{dotted(path, &doc.root), text, it == doc.where.end() ? "" : it->second});
  }
}

void complete_from_schema(Document& doc, std::vector<Issue>& errors) {
  SchemaWalk(doc, errors).run();
}

}  // namespace kdedup::config::detail
