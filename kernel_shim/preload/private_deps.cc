// Binding the shim's private dependencies to their own definitions (private_deps.h).
#include "kernel_shim/preload/private_deps.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace tessera::kernel_shim::shim {
namespace {

constexpr uintptr_t kPage = 4096;
constexpr int kMaxPrivate = 16;
struct PrivateObject {
  char name[128];  // DT_NEEDED name of the shim (e.g. "libisal.so.2"); "" for the shim itself.
  uintptr_t base = 0;
  const ElfW(Dyn) * dynamic = nullptr;
  uintptr_t relro_start = 0, relro_end = 0;
  void* handle = nullptr;
};
PrivateObject g_private[kMaxPrivate];
int g_private_count = 0;
uint64_t g_rebound = 0;  // GOT slots rebound.

bool SystemLibrary(const char* name) {
  static const char* const kSystem[] = {"libc.so",  "libm.so",  "libstdc++.so",  "libgcc_s.so",
                                        "ld-linux", "libdl.so", "libpthread.so", "librt.so"};
  for (const char* s : kSystem) {
    if (strstr(name, s) != nullptr) return true;
  }
  return false;
}

uintptr_t DynPtr(uintptr_t base, ElfW(Addr) v) { return v < base ? base + v : v; }

int FindPrivateObjects(struct dl_phdr_info* info, size_t, void* self_addr) {
  const ElfW(Dyn)* dyn = nullptr;
  uintptr_t relro_start = 0, relro_end = 0;
  bool self = false;
  const auto self_a = reinterpret_cast<uintptr_t>(self_addr);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + ph.p_vaddr);
    if (ph.p_type == PT_GNU_RELRO) {
      relro_start = info->dlpi_addr + ph.p_vaddr;
      relro_end = relro_start + ph.p_memsz;
    }
    if (ph.p_type == PT_LOAD && self_a >= info->dlpi_addr + ph.p_vaddr &&
        self_a < info->dlpi_addr + ph.p_vaddr + ph.p_memsz) {
      self = true;
    }
  }
  if (dyn == nullptr || g_private_count >= kMaxPrivate) return 0;
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (!self) {
    // A dependency named in the shim's DT_NEEDED list (collected from the shim first: the
    // shim is loaded before its dependencies, so dl_iterate_phdr reaches it first).
    if (g_private_count == 0) return 0;
    const PrivateObject& shim = g_private[0];
    uintptr_t strtab = 0;
    for (const ElfW(Dyn)* d = shim.dynamic; d->d_tag != DT_NULL; ++d) {
      if (d->d_tag == DT_STRTAB) strtab = DynPtr(shim.base, d->d_un.d_ptr);
    }
    bool needed = false;
    for (const ElfW(Dyn)* d = shim.dynamic; d->d_tag != DT_NULL && strtab != 0; ++d) {
      if (d->d_tag != DT_NEEDED) continue;
      const char* n = reinterpret_cast<const char*>(strtab + d->d_un.d_val);
      const char* slash = strrchr(name, '/');
      if (!SystemLibrary(n) && strcmp(slash != nullptr ? slash + 1 : name, n) == 0) needed = true;
    }
    if (!needed) return 0;
  } else if (g_private_count != 0) {
    return 0;
  }
  PrivateObject& o = g_private[g_private_count++];
  const char* slash = strrchr(name, '/');
  snprintf(o.name, sizeof(o.name), "%s", self ? "" : (slash != nullptr ? slash + 1 : name));
  o.base = info->dlpi_addr;
  o.dynamic = dyn;
  o.relro_start = relro_start;
  o.relro_end = relro_end;
  return 0;
}

void RebindSlots(const PrivateObject& o) {
  uintptr_t symtab = 0, strtab = 0, jmprel = 0, rela = 0;
  size_t pltrelsz = 0, relasz = 0;
  for (const ElfW(Dyn)* d = o.dynamic; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symtab = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_STRTAB:
        strtab = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_JMPREL:
        jmprel = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_PLTRELSZ:
        pltrelsz = d->d_un.d_val;
        break;
      case DT_RELA:
        rela = DynPtr(o.base, d->d_un.d_ptr);
        break;
      case DT_RELASZ:
        relasz = d->d_un.d_val;
        break;
      default:
        break;
    }
  }
  if (symtab == 0 || strtab == 0) return;
  const auto* syms = reinterpret_cast<const ElfW(Sym)*>(symtab);
  auto one = [&](const ElfW(Rela) & r) {
    const auto type = ELF64_R_TYPE(r.r_info);
#if defined(__x86_64__)
    if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) return;
#elif defined(__aarch64__)
    if (type != R_AARCH64_JUMP_SLOT && type != R_AARCH64_GLOB_DAT) return;
#else
    (void)type;
    return;
#endif
    const ElfW(Sym)& sym = syms[ELF64_R_SYM(r.r_info)];
    if (sym.st_name == 0) return;
    const char* name = reinterpret_cast<const char*>(strtab + sym.st_name);
    // The definition among the private dependencies (not the shim's own exports: those are
    // meant to be found through the global scope).
    void* def = nullptr;
    for (int i = 1; i < g_private_count && def == nullptr; ++i) {
      if (g_private[i].handle == nullptr) continue;
      void* d = dlsym(g_private[i].handle, name);
      Dl_info di;
      void* entry = nullptr;
      if (d == nullptr || dladdr1(d, &di, &entry, RTLD_DL_SYMENT) == 0 || di.dli_fname == nullptr ||
          entry == nullptr) {
        continue;
      }
      const auto* def_sym = static_cast<const ElfW(Sym)*>(entry);
      // Functions only: a data object may have been copied into the executable (a copy
      // relocation), and then the executable's copy is the one every object must use.
      const int t = ELF64_ST_TYPE(def_sym->st_info);
      if (t != STT_FUNC && t != STT_GNU_IFUNC) continue;
      const char* slash = strrchr(di.dli_fname, '/');
      const char* base = slash != nullptr ? slash + 1 : di.dli_fname;
      for (int j = 1; j < g_private_count; ++j) {
        if (strcmp(base, g_private[j].name) == 0) def = d;
      }
    }
    if (def == nullptr || dlsym(RTLD_DEFAULT, name) == def) return;
    auto* slot = reinterpret_cast<void**>(o.base + r.r_offset);
    if (*slot == def) return;
    const bool relro = reinterpret_cast<uintptr_t>(slot) >= o.relro_start &&
                       reinterpret_cast<uintptr_t>(slot) < o.relro_end;
    const uintptr_t page = reinterpret_cast<uintptr_t>(slot) & ~(kPage - 1);
    if (relro && syscall(SYS_mprotect, page, kPage, PROT_READ | PROT_WRITE) != 0) return;
    *slot = def;
    if (relro) syscall(SYS_mprotect, page, kPage, PROT_READ);
    ++g_rebound;
  };
  for (size_t i = 0; jmprel != 0 && i < pltrelsz / sizeof(ElfW(Rela)); ++i) {
    one(reinterpret_cast<const ElfW(Rela)*>(jmprel)[i]);
  }
  for (size_t i = 0; rela != 0 && i < relasz / sizeof(ElfW(Rela)); ++i) {
    one(reinterpret_cast<const ElfW(Rela)*>(rela)[i]);
  }
}
}  // namespace

uint64_t BindPrivateDependencies() {
  static int anchor;  // An address inside the shim (FindPrivateObjects).
  dl_iterate_phdr(FindPrivateObjects, &anchor);
  for (int i = 1; i < g_private_count; ++i) {
    g_private[i].handle = dlopen(g_private[i].name, RTLD_LAZY | RTLD_NOLOAD);
  }
  for (int i = 0; i < g_private_count; ++i) RebindSlots(g_private[i]);
  return g_rebound;
}

}  // namespace tessera::kernel_shim::shim
