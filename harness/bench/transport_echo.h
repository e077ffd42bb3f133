// `fd-transport-bench serve`: the R-worker end of the transport benchmark, a process of its own started
// with fd::SpawnedRWorker like fd-rworker. It speaks the real protocol (fastdecode/wire/wire.h): each
// request is checked by proto::decode with the R-worker's limits, and an ATTEND gets a real ATTEND_REPLY
// header and an o frame of n_seq * n_heads * head_dim elements, without any attention computed (o is a
// constant buffer sent zero-copy), so the benchmark times the link and not the kernel. SHUTDOWN gets OK
// and ends the process; anything else, or a malformed request, an ERROR reply with the decoder's code
// and message.
#pragma once

namespace fd::bench {

// argv[0] is "serve". Options as fd-rworker's where they mean the same (--listen, --print-endpoint,
// --max-message-mb), plus --ipc PATH, --io-threads N and --fail-after N. Returns the exit status.
int transport_echo_main(int argc, char** argv);

}  // namespace fd::bench
