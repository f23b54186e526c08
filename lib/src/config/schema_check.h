#pragma once
// Internal to kdedup::config: the JSON Schema's part of loading a config
// (schemas/config.schema.json, compiled into the library). Two passes over
// the converted document, each appending every problem it finds:
//   1. complete_from_schema: document and schema walked together: plain
//      scalars get their text back where the schema wants a string, an
//      empty section (null) becomes {}, unknown keys are reported with the
//      closest known name;
//   2. validate_schema: valijson's check, keeping only the most specific
//      error of each value, worded for a person.
// Plain functions; the parsed schema is built once and read-only after.

#include <vector>

#include "kdedup/config/config.h"
#include "yaml_json.h"

namespace kdedup::config::detail {

/// The embedded schema, parsed once.
[[nodiscard]] const Json& schema_document();

/// Pass 1 (see the file comment).
void complete_from_schema(Document& doc, std::vector<Issue>& errors);

/// Pass 2 (see the file comment).
void validate_schema(const Document& doc, std::vector<Issue>& errors);

}  // namespace kdedup::config::detail
