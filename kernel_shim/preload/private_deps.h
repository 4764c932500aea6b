// Internal to kernel_shim/preload/: the shim's private dependencies.
//
// The store and the pager run inside the paged program, on shared libraries the shim needs
// (ISA-L, liburing, nettle, verbs). The dynamic linker resolves their calls through the
// global scope, where the program's executable comes first: a program that exports a function
// of the same name captures those calls. node exports OpenSSL's gf_mul(gf c, gf a, gf b), so
// ISA-L's internal calls to its own gf_mul(a, b) (and the codec's) went into OpenSSL and
// crashed the first time the store encoded a page, i.e. at the first eviction. So at load,
// before the store exists, every GOT slot of the shim and of its private dependencies that
// names a function one of those dependencies defines is bound to that definition.
#pragma once

#include <cstdint>

#pragma GCC visibility push(hidden)
namespace tessera::kernel_shim::shim {

// Rebinds those GOT slots (of the shim and of each private dependency). Call once, at load,
// before any of those dependencies runs. Returns how many slots were rebound.
uint64_t BindPrivateDependencies();

}  // namespace tessera::kernel_shim::shim
#pragma GCC visibility pop
