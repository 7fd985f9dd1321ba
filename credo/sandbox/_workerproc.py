"""Entry point of a sandbox worker process:
``python -m credo.sandbox._workerproc FD INDEX ROOT UID_BASE MODE PARENT_PID PDEATHSIG``.

The worker binds its lifetime to PARENT_PID (:func:`credo.procs.bind_to_parent`) before anything else, so a
worker busy in a long job does not outlive a killed parent.
"""
import sys

if __name__ == "__main__":
    from credo.procs import bind_to_parent

    bind_to_parent(int(sys.argv[6]), pdeathsig=sys.argv[7] == "1")

    from multiprocessing.connection import Connection

    from credo.sandbox.pool import _worker_main

    fd, index, root, uid_base, mode = sys.argv[1:6]
    _worker_main(Connection(int(fd)), int(index), root, int(uid_base), mode == "isolated")
