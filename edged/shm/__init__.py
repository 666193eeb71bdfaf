"""Tensors in local clients' shared memory: the regions they register (POSIX objects,
sealed memfds, CUDA IPC handles), how each is mapped and checked at each use, and the
memfd sockets they are handed over on. Serving resolves a request's references here.
"""
