"""The CUDA target: takes GPU loop IR (block/thread-bound loops, shared and local buffers, barriers) and gives PTX
kernels for NVIDIA GPUs (sm_80, sm_90) through LLVM's NVPTX backend, checked by ptxas, run through the driver API."""
