// Statistics of the benchmarks' timings. Host only, no GPU runtime: rocep_bench includes it in the build
// with no GPU platform too.
#pragma once

#include <algorithm>
#include <vector>

namespace rocep::bench {

// The middle value of `values` (the upper middle one for an even count); 0 for no values.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

}  // namespace rocep::bench
