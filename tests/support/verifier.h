#pragma once
// The tests' names for the output oracle. It lives in the testbroker module
// (kdedup/testbroker/output_oracle.h) so that `kdedup demo` and the pipeline
// benchmark judge their output with the same code as the tests.

#include "kdedup/testbroker/output_oracle.h"

namespace kdedup::testing {

using testbroker::false_positive_bound;
using testbroker::InputRecord;
using testbroker::OutputRecord;
using testbroker::to_input_records;
using testbroker::to_output_records;
using testbroker::verify_by_identity;
using testbroker::verify_output;
using testbroker::VerifyReport;
using testbroker::VerifySpec;

}  // namespace kdedup::testing
