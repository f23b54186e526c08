#pragma once
// Error values for kdedup. Hot paths and library boundaries return
// Result<T> instead of throwing; the message is meant for a person and names
// what was wrong and where ("--window: '10x' is not a duration").

#include <string>
#include <utility>

#include <tl/expected.hpp>

namespace kdedup {

/// A failure a caller must look at. `message` is complete on its own.
struct Error {
  std::string message;
};

template <class T>
using Result = tl::expected<T, Error>;

/// Result of an operation that produces no value.
using Status = tl::expected<void, Error>;

/// Shorthand for returning a failure: `return fail("bad value");`.
inline tl::unexpected<Error> fail(std::string message) {
  return tl::unexpected<Error>(Error{std::move(message)});
}

}  // namespace kdedup
