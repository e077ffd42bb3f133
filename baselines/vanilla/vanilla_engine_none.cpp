// Built instead of vanilla_engine.cpp when no usable LibTorch was found at configure time.
#include "baselines/vanilla/vanilla_engine.h"

namespace fd {

VanillaBuild vanilla_build() { return {}; }

std::unique_ptr<Engine> make_vanilla_engine(const VanillaConfig&, const EngineContext&) {
  FD_THROW("vanilla engine: built without LibTorch (install libtorch-dev, scripts/setup.sh)");
}

}  // namespace fd
