"""Entry point of a sandbox worker process: ``python -m credo.sandbox._workerproc FD INDEX ROOT UID_BASE MODE``."""
import sys
from multiprocessing.connection import Connection

from credo.sandbox.pool import _worker_main

if __name__ == "__main__":
    fd, index, root, uid_base, mode = sys.argv[1:6]
    _worker_main(Connection(int(fd)), int(index), root, int(uid_base), mode == "isolated")
