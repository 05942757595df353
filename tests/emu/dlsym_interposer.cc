// A library that defines a driver name itself, preloaded ahead of libgpumem.so by the dlsym tests: the program's dlsym(RTLD_NEXT) must find it first, as without gpumem.
#include <cstddef>

extern "C" __attribute__((visibility("default"))) int cuMemAlloc_v2(unsigned long long* p, size_t) {
    if (p) *p = 0;
    return 4343;
}
