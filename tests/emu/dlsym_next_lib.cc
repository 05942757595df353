// A library the dlsym probe links (a dependency of the program, so after libgpumem.so in the search list): its dlsym(RTLD_NEXT) searches only the objects after it.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

// Prints <key>_libnext=0|1, <key>_libnext_dlerror=0|1 and <key>_libnext_interposer=0|1 (the answer
// is the test interposer's function, tests/emu/dlsym_interposer.cc).
extern "C" __attribute__((visibility("default"))) void dlsym_next_probe(const char* key, const char* name) {
    dlerror();
    void* p = dlsym(RTLD_NEXT, name);
    const bool error_set = dlerror() != nullptr;
    Dl_info info{};
    const bool interposer = p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "dlsym_interposer");
    printf("%s_libnext=%d\n%s_libnext_dlerror=%d\n%s_libnext_interposer=%d\n", key, p != nullptr, key, error_set, key,
           interposer);
}
