// The whole public API of rocep.
#pragma once

#include "config.hpp"    // IWYU pragma: export
#include "ep_group.hpp"  // IWYU pragma: export
#include "errors.hpp"    // IWYU pragma: export
#include "silu.hpp"      // IWYU pragma: export
#include "types.hpp"     // IWYU pragma: export
