// Planted faults: scripts/fault-check.sh builds the project with one known defect at a time
// (cmake -DFD_PLANT_FAULT=NAME) and checks that the test suite goes red for each. A file that holds fault NAME
// includes the generated header "fd_fault_NAME.h" (CMakeLists.txt writes one per fault: it defines FD_FAULT_<NAME>
// in the build that plants NAME, nothing otherwise) and guards the defect with #ifdef FD_FAULT_<NAME>; a normal
// build defines none of them, and switching faults rebuilds only the files of the two. This header is their list
// (CMakeLists.txt FD_FAULTS; tests/python/test_fault_check.py checks that the two agree with the code):
//   drop_last_token              the FastDecode engine drops each request's last token
//   shift_tokens                 the FastDecode engine emits one request's tokens shifted by one
//   zero_head                    the R-worker returns zeros for query head 1
//   sampler_ignores_temperature  fd::sample_token draws at temperature 1 whatever it is given
//   int4_wrong_nibble            the int4 quantizer writes one wrong nibble per block
//   tp_skip_reduce               a tensor-parallel CPU S-Part skips the all-reduce of the MLP branch
//   sls_projection_drops_last_step  the SLS scheduler's projected load ends each sequence's life a step early,
//                                   so load control (W_lim) and the KV capacity cap miss every sequence's peak
//   swap_in_drops_partial_block  the paged-swap block manager swaps a sequence back in without copying its partly
//                                filled last block (its newest tokens' K/V are lost)
//   wire_last_frame_unchecked    wire decode() does not check the last frame's size (a truncated ATTEND, APPEND_KV or
//                                ATTEND_REPLY is accepted)
// and, on the GPU machine only (CMakeLists.txt FD_GPU_FAULTS; scripts/fault-check.sh --gpu):
//   gpu_probe_fails              the CUDA device query fails (GPU tests must then fail under FD_REQUIRE_GPU=1)
//   cuda_decode_skips_last_kv    the CUDA decode attention kernel (kernels/cuda/attention.cu) takes each sequence's
//                                length as one less: the newest K/V position is never attended
#pragma once
