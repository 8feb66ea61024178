"""Artifact: takes a Graph and the best records of its tasks; gives one .tar (the kernels, an AOT entry point, the
weights, a C header and meta.json) and the loader that runs it with ctypes and numpy."""
