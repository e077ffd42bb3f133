// Planted faults: scripts/fault-check.sh builds the project with one known defect at a time
// (cmake -DFD_PLANT_FAULT=NAME) and checks that the test suite goes red for each. A file that holds a
// fault includes this header and guards the defect with #ifdef FD_FAULT_<NAME>; a normal build defines
// none of them. The faults (CMakeLists.txt FD_FAULTS):
//   drop_last_token              the FastDecode engine drops each request's last token
//   shift_tokens                 the FastDecode engine emits one request's tokens shifted by one
//   zero_head                    the R-worker returns zeros for query head 1
//   sampler_ignores_temperature  fd::sample_token draws at temperature 1 whatever it is given
//   int4_wrong_nibble            the int4 quantizer writes one wrong nibble per block
//   tp_skip_reduce               a tensor-parallel CPU S-Part skips the all-reduce of the MLP branch
//   gpu_probe_fails              the CUDA device query fails (GPU tests must then fail under FD_REQUIRE_GPU=1)
#pragma once
#include "fd_planted_fault.h"
