// The whole public API of rocep, without MPI (<rocep/mpi.hpp> adds the MPI bootstrap).
#pragma once

#include "bootstrap.hpp"   // IWYU pragma: export
#include "build_info.hpp"  // IWYU pragma: export
#include "config.hpp"      // IWYU pragma: export
#include "ep_group.hpp"    // IWYU pragma: export
#include "errors.hpp"      // IWYU pragma: export
#include "silu.hpp"        // IWYU pragma: export
#include "types.hpp"       // IWYU pragma: export
