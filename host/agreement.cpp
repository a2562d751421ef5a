#include "agreement.hpp"

#include <algorithm>
#include <array>
#include <exception>
#include <string>
#include <vector>

#include "rocep/errors.hpp"

namespace rocep {

namespace {

enum class FailureKind : char { kNone, kConfig, kGpuRuntime, kBootstrap, kOther };

// One rank's outcome, as it travels: its kind and the start of its message.
struct Outcome {
  FailureKind kind = FailureKind::kNone;
  std::array<char, 503> message{};
};

Outcome outcome_of(std::exception_ptr failure) {
  Outcome outcome;
  if (!failure) {
    return outcome;
  }
  std::string text = "unknown exception";
  try {
    std::rethrow_exception(failure);
  } catch (const ConfigError& error) {
    outcome.kind = FailureKind::kConfig;
    text = error.what();
  } catch (const GpuRuntimeError& error) {
    outcome.kind = FailureKind::kGpuRuntime;
    text = error.what();
  } catch (const BootstrapError& error) {
    outcome.kind = FailureKind::kBootstrap;
    text = error.what();
  } catch (const std::exception& error) {
    outcome.kind = FailureKind::kOther;
    text = error.what();
  } catch (...) {
    outcome.kind = FailureKind::kOther;
  }
  std::copy_n(text.begin(), std::min(text.size(), outcome.message.size() - 1), outcome.message.begin());
  return outcome;
}

}  // namespace

void agree_on_step(Bootstrap& bootstrap, const char* step_name, std::exception_ptr failure) {
  const Outcome mine = outcome_of(failure);
  std::vector<Outcome> all(bootstrap.size());
  try {
    bootstrap.all_gather(&mine, all.data(), sizeof mine);
  } catch (const std::exception& error) {  // no agreement: this rank says what it knows
    throw BootstrapError(std::string(error.what()) + " (at " + step_name +
                         (failure
                              ? std::string(", after this rank's own failure there: ") + mine.message.data()
                              : std::string()) +
                         ")");
  }
  const auto first = std::find_if(all.begin(), all.end(),
                                  [](const Outcome& outcome) { return outcome.kind != FailureKind::kNone; });
  if (first == all.end()) {
    return;
  }
  const std::string message = "EpGroup: rank " + std::to_string(first - all.begin()) + " failed at " +
                              step_name + ": " + first->message.data();
  switch (first->kind) {
    case FailureKind::kConfig:
      throw ConfigError(message);
    case FailureKind::kGpuRuntime:
      throw GpuRuntimeError(message);
    case FailureKind::kBootstrap:
      throw BootstrapError(message);
    default:
      throw Error(message);
  }
}

}  // namespace rocep
