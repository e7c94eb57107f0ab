# Cython declarations of the C++ communicator core (comm/cpp/include/skyfn_comm/
# communicator.hpp) and of the binding's glue (comm/_glue.h). Declarations only.
from libc.stdint cimport uint8_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector


cdef extern from "_glue.h" namespace "skyfn_glue":
    void set_exception_types(object comm, object auth, object timeout, object lost)
    void translate_exception()


cdef extern from "skyfn_comm/communicator.hpp" namespace "skyfn::comm" nogil:
    cdef enum class DType(int):
        Int32
        Int64
        Float32
        Float64

    cdef enum class ReduceOp(int):
        Sum
        Min
        Max
        Prod

    cdef cppclass Buffer:
        vector[uint8_t] data
        size_t size()

    cdef cppclass JoinOptions:
        string group
        string rendezvous_host
        int rendezvous_port
        string token
        int size
        int rank
        double timeout_s
        double punch_timeout_s
        double keepalive_s
        cbool allow_direct

    cdef cppclass PeerStats:
        int rank
        string mode
        string address
        uint64_t bytes_sent
        uint64_t bytes_received

    cdef cppclass Request:
        cbool test() except +translate_exception
        void wait() except +translate_exception
        shared_ptr[Buffer] result() except +translate_exception

    cdef cppclass Communicator:
        int rank()
        int size()
        void send(const void* data, size_t length, int dest, int tag) except +translate_exception
        shared_ptr[Buffer] recv(int source, int tag) except +translate_exception
        shared_ptr[Request] isend(const void* data, size_t length, int dest, int tag) except +translate_exception
        shared_ptr[Request] irecv(int source, int tag) except +translate_exception
        void barrier() except +translate_exception
        shared_ptr[Buffer] bcast(const void* data, size_t length, int root) except +translate_exception
        vector[shared_ptr[Buffer]] gatherv(const void* data, size_t length, int root) except +translate_exception
        shared_ptr[Buffer] scatterv(const vector[pair[const void*, size_t]]& parts, int root) except +translate_exception
        vector[shared_ptr[Buffer]] allgatherv(const void* data, size_t length) except +translate_exception
        vector[shared_ptr[Buffer]] alltoallv(const vector[pair[const void*, size_t]]& parts) except +translate_exception
        shared_ptr[Buffer] reduce(const void* data, size_t count, DType dtype, ReduceOp op, int root) except +translate_exception
        shared_ptr[Buffer] allreduce(const void* data, size_t count, DType dtype, ReduceOp op) except +translate_exception
        vector[PeerStats] stats() except +translate_exception
        void close() except +translate_exception

    const char* version()


cdef extern from "_glue.h" namespace "skyfn_glue" nogil:
    cdef cppclass CallLock:
        void lock()
        void unlock()
    Communicator* join(const JoinOptions& opts) except +translate_exception
    void wait_quietly(const shared_ptr[Request]& r) noexcept
    void close_quietly(Communicator* c) noexcept
