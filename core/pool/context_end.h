// How a context's end reaches the pool: before the driver's call, after it, or at process exit.
#pragma once

namespace gpumem {

// block_pool::drop_all's argument; the hooks pick it (preload/hooks_driver.cc).
enum class context_end {
    coming,  // the call that ends it comes next (cuCtxDestroy, cuDevicePrimaryCtxReset)
    past,    // the driver has ended it (a primary context's last cuDevicePrimaryCtxRelease)
    forget,  // give nothing back: the process is exiting, and its end frees everything anyway
};

}  // namespace gpumem
