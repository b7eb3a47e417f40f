// MPI return codes as shardlm errors, for the files that call MPI (communicators are created with
// MPI_ERRORS_RETURN, so a failing call comes back here instead of aborting inside MPI).
#pragma once

#ifdef SHARDLM_HAVE_MPI

#include <fmt/format.h>
#include <mpi.h>

#include <string>

#include "core/error.h"

namespace shardlm::comm {

// Throws "what: MPI's text for rc" unless rc is MPI_SUCCESS.
inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  throw Error(fmt::format("{}: {}", what, std::string(text, size_t(n))));
}

}  // namespace shardlm::comm

#endif  // SHARDLM_HAVE_MPI
