#pragma once

#include <exception>
#include <source_location>
#include <string>

#include <c10/util/Exception.h>

namespace fairring {

// How a failure is classed for torch: as NCCL's and Gloo's process groups
// class theirs, so that torchelastic, torchft and users' retry loops that
// catch torch.distributed.DistBackendError, DistNetworkError or
// DistStoreError catch fairring's too. In Python each is a RuntimeError whose
// text is the message alone (torch adds the C++ stack only under
// TORCH_SHOW_CPP_STACKTRACES=1).
enum class ErrorClass {
  kBackend, // a collective failed or timed out, or a peer failed
  kNetwork, // a connection broke, a transfer failed, a NIC went down
  kStore, // the store did not hold a peer's record in time
};

// The error as an exception_ptr, for a future's setError.
inline std::exception_ptr distError(
    ErrorClass errorClass,
    std::string message,
    std::source_location where = std::source_location::current()) {
  const c10::SourceLocation location{
      where.function_name(), where.file_name(), where.line()};
  switch (errorClass) {
    case ErrorClass::kNetwork:
      return std::make_exception_ptr(
          c10::DistNetworkError(location, std::move(message)));
    case ErrorClass::kStore:
      return std::make_exception_ptr(
          c10::DistStoreError(location, std::move(message)));
    case ErrorClass::kBackend:
      break;
  }
  return std::make_exception_ptr(
      c10::DistBackendError(location, std::move(message)));
}

} // namespace fairring
