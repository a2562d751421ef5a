// Typed exceptions thrown by every rocep call. All derive from rocep::Error, so one catch clause handles
// them all; the subclasses let a server tell a bad configuration (fix the code) from a timeout (a peer is
// gone) from bad routing data (fix the router).
#pragma once

#include <stdexcept>
#include <string>

namespace rocep {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An EpConfig field, or a call argument, is outside its allowed range. The message names the field, the
// value and the allowed range.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message) {}
};

// The HIP/CUDA runtime returned an error. The message holds the runtime's own text and the file:line of the
// failing call.
class GpuRuntimeError : public Error {
 public:
  explicit GpuRuntimeError(const std::string& message) : Error(message) {}
};

// A bounded wait ran out: the message names the operation, the peer rank and what was awaited.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(message) {}
};

// Data handed to a call is invalid (an expert id out of range, a token count above the maximum, ...). The
// message names the rank, the token and the slot where they are known. issued() tells what the group
// expects next: true where this rank's part of the call was issued anyway (dispatch / dispatch_send with
// bad inputs take part as a rank with zero tokens; errors the kernels recorded), so the next call is the one
// after it; false where the call was refused before anything was issued, so it may be repeated.
class InvalidInputError : public Error {
 public:
  explicit InvalidInputError(const std::string& message, bool issued = false)
      : Error(message), issued_(issued) {}
  bool issued() const { return issued_; }

 private:
  bool issued_;
};

// A call came out of the order dispatch (or dispatch_send, dispatch_recv), combine (or combine_send,
// combine_recv), dispatch, ... on this rank, or while another thread was inside a call of the same group.
// Nothing was issued; the group's state is unchanged.
class CallOrderError : public Error {
 public:
  explicit CallOrderError(const std::string& message) : Error(message) {}
};

// A bootstrap collective (all-gather, barrier) or a step of group creation failed. At group creation
// every rank throws it, naming the rank and the step that failed first.
class BootstrapError : public Error {
 public:
  explicit BootstrapError(const std::string& message) : Error(message) {}
};

// What the kernels (or the CPU reference) recorded while calls ran, as EpGroup::poll_error() returns it.
struct RecordedError {
  enum class Kind { kNone, kInvalidInput, kTimeout };
  Kind kind = Kind::kNone;
  std::string message;  // names the operation, the rank and what went wrong

  explicit operator bool() const { return kind != Kind::kNone; }
  // Throws the typed exception: InvalidInputError or TimeoutError. Does nothing for kNone.
  void raise() const {
    if (kind == Kind::kInvalidInput) {
      throw InvalidInputError(message, true);
    }
    if (kind == Kind::kTimeout) {
      throw TimeoutError(message);
    }
  }
};

}  // namespace rocep
