"""The communicator (DESIGN.md section 7, wire contract in docs/comm.md): direct
function-to-function channels punched through NATs (relayed when punching fails), with
MPI-like point-to-point and collective operations. C++17 core (comm/cpp), Cython binding
(comm/_core.pyx), Python API here.

    from comm import Communicator
    c = Communicator.join("grp", rendezvous="host:port", token=token, size=4)
    c.send(numpy_array, dest=1); buf = c.recv(source=0)     # buf: comm.Buffer (zero-copy)
    total = c.allreduce(numpy_array, op="sum")

comm.arrow sends pyarrow Tables (IPC stream); comm.join.distributed_join is the Cylon-style
hash-partitioned distributed join.
"""
from comm.communicator import Buffer, Communicator, Request
from comm.errors import AuthError, CommError, PeerLostError, TimeoutError  # noqa: A004

__all__ = ["AuthError", "Buffer", "CommError", "Communicator", "PeerLostError", "Request",
           "TimeoutError"]
