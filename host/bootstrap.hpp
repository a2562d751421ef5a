// Which GPU a rank of a node uses.
#pragma once

namespace rocep {

// The GPU a rank uses: its rank on the node modulo the devices it sees, unless `override_text` (the
// ROCEP_DEVICE environment variable) names a device. Throws ConfigError for an override that is not a
// device index in [0, device_count).
int device_for_local_rank(int local_rank, int device_count, const char* override_text);

}  // namespace rocep
