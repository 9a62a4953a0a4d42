// Asserting on error messages: the message of the exception a call throws.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "strata/core/error.h"

namespace strata::testing {

/// Runs `fn` and returns the message of the `ErrorType` it throws. Records
/// a test failure and returns "" when it throws nothing (another exception
/// type propagates and fails the test with its own message).
template <class ErrorType = strata::Error, class Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const ErrorType& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, but none was thrown";
  return "";
}

}  // namespace strata::testing
