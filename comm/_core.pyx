# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""Cython binding of the C++ communicator core (comm/cpp): the thin layer under comm.

Owns the C++ objects, converts arguments, releases the GIL around every call that can
block, turns C++ exceptions into comm.errors, and moves bytes without copying: sends
read the caller's buffer in place (kept exported until the send completes) and received
messages are Buffer objects that expose the core's memory through the buffer protocol.
Argument checking with friendly messages is done one level up, in comm.communicator.
"""
cimport cython
from cpython.buffer cimport (PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES,
                             PyBuffer_Release, PyObject_GetBuffer)
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libcpp.memory cimport shared_ptr
from libcpp.utility cimport pair
from libcpp.vector cimport vector

from comm._libcomm cimport (Buffer as CBuffer, CallLock, Communicator as CCommunicator, DType,
                            JoinOptions, PeerStats, ReduceOp, Request as CRequest,
                            close_quietly, join as c_join, set_exception_types,
                            version as c_version, wait_quietly)

from comm import errors as _errors

set_exception_types(_errors.CommError, _errors.AuthError, _errors.TimeoutError,
                    _errors.PeerLostError)

cdef uint8_t _EMPTY = 0
cdef char* _FORMAT_B = b"B"


def core_version():
    """Version string of the C++ core library."""
    return c_version().decode()


cdef int _acquire(object obj, Py_buffer* view, str what) except -1:
    """Export obj's bytes (C-contiguous) into view, with errors that say what to pass."""
    if isinstance(obj, str):
        raise TypeError(f"{what} needs a bytes-like object, got str: encode it first "
                        "(for example s.encode())")
    try:
        PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS)
    except (BufferError, ValueError) as e:
        raise ValueError(f"{what} needs a C-contiguous buffer ({e}): pass "
                         "numpy.ascontiguousarray(x) or bytes(x)") from None
    except TypeError:
        raise TypeError(f"{what} needs a bytes-like object (anything with the buffer "
                        "protocol: bytes, bytearray, memoryview, numpy array, comm.Buffer), "
                        f"got {type(obj).__name__}") from None
    return 0


cdef class Buffer:
    """A received message. Owns the bytes the core received (no copy was made) and
    exposes them through the buffer protocol: ``memoryview(b)``, ``bytes(b)``,
    ``numpy.frombuffer(b, dtype)`` and ``pyarrow.py_buffer(b)`` all share the memory,
    which stays alive as long as any of them does. ``len(b)`` is the size in bytes.
    The memory is writable: the message belongs to the receiver."""
    cdef shared_ptr[CBuffer] _buf
    cdef Py_ssize_t _shape[1]
    cdef Py_ssize_t _strides[1]

    def __init__(self):
        raise TypeError("comm.Buffer objects are made by the communicator (recv, "
                        "collectives); wrap your own bytes with memoryview instead")

    @staticmethod
    cdef Buffer wrap(shared_ptr[CBuffer] b):
        cdef Buffer o = Buffer.__new__(Buffer)
        o._buf = b
        return o

    cdef size_t _size(self):
        return self._buf.get().size() if self._buf.get() != NULL else 0

    def __getbuffer__(self, Py_buffer* view, int flags):
        cdef size_t n = self._size()
        self._shape[0] = <Py_ssize_t>n
        self._strides[0] = 1
        view.buf = <void*>self._buf.get().data.data() if n else <void*>&_EMPTY
        view.obj = self
        view.len = <Py_ssize_t>n
        view.readonly = 0
        view.itemsize = 1
        view.format = _FORMAT_B if (flags & PyBUF_FORMAT) == PyBUF_FORMAT else NULL
        view.ndim = 1
        view.shape = NULL
        view.strides = NULL
        if (flags & PyBUF_ND) == PyBUF_ND:
            view.shape = &self._shape[0]
        if (flags & PyBUF_STRIDES) == PyBUF_STRIDES:
            view.strides = &self._strides[0]
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass

    def __len__(self):
        return self._size()

    @property
    def nbytes(self):
        """Size of the message in bytes."""
        return self._size()

    def tobytes(self):
        """A bytes copy of the message."""
        cdef size_t n = self._size()
        if n == 0:
            return b""
        return PyBytes_FromStringAndSize(<char*>self._buf.get().data.data(), <Py_ssize_t>n)

    def __eq__(self, other):
        try:
            return memoryview(self) == memoryview(other).cast("B")
        except TypeError:
            return NotImplemented

    __hash__ = None

    def __repr__(self):
        return f"<comm.Buffer {self._size()} bytes>"


@cython.no_gc_clear  # __dealloc__ needs _owner's lock even when collected in a cycle
cdef class Request:
    """A non-blocking send or receive. ``wait()`` blocks until it completes (or the
    communicator's timeout passes) and returns the received Buffer for irecv, None for
    isend; ``test()`` returns True once it has completed. An isend keeps its buffer
    exported until it completes; a request dropped before completing waits for it."""
    cdef shared_ptr[CRequest] _req
    cdef CallLock* _lock  # the communicator's (kept alive by _owner)
    cdef Py_buffer _view
    cdef bint _has_view
    cdef bint _recv
    cdef bint _done
    cdef object _owner   # the _Core: outlives every request made on it
    cdef object _result
    cdef object _error

    def __init__(self):
        raise TypeError("requests are made by Communicator.isend/irecv")

    cdef void _release(self):
        if self._has_view:
            PyBuffer_Release(&self._view)
            self._has_view = False

    cdef _finish(self):
        self._done = True
        if self._recv:
            self._result = Buffer.wrap(self._req.get().result())
        self._release()

    def test(self):
        """Make progress; True when the request has completed (raises its error)."""
        cdef bint ok
        if self._error is not None:
            raise self._error
        if self._done:
            return True
        try:
            with nogil:
                self._lock.lock()
                try:
                    ok = self._req.get().test()
                finally:
                    self._lock.unlock()
        except BaseException as e:
            self._error = e
            self._done = True
            self._release()
            raise
        if ok:
            self._finish()
        return ok

    def wait(self):
        """Block until complete; returns the Buffer (irecv) or None (isend)."""
        if self._error is not None:
            raise self._error
        if not self._done:
            try:
                with nogil:
                    self._lock.lock()
                    try:
                        self._req.get().wait()
                    finally:
                        self._lock.unlock()
            except BaseException as e:
                self._error = e
                self._done = True
                self._release()
                raise
            self._finish()
        return self._result

    @property
    def done(self):
        """True once wait() or test() has seen the request complete."""
        return self._done

    def __dealloc__(self):
        if self._has_view:
            if not self._done:
                with nogil:
                    self._lock.lock()
                    try:
                        wait_quietly(self._req)
                    finally:
                        self._lock.unlock()
            PyBuffer_Release(&self._view)
            self._has_view = False


ctypedef const void* cvoidp


cdef inline pair[cvoidp, size_t] _part(void* p, size_t n) noexcept:
    cdef pair[cvoidp, size_t] out
    out.first = p
    out.second = n
    return out


cdef class _Views:
    """Exported buffers of a list of objects, released when this object goes away."""
    cdef Py_buffer* _views
    cdef Py_ssize_t _n
    cdef Py_ssize_t _acquired
    cdef vector[pair[cvoidp, size_t]] parts

    def __cinit__(self, list objs, str what):
        self._n = len(objs)
        self._acquired = 0
        self._views = <Py_buffer*>PyMem_Calloc(max(self._n, 1), sizeof(Py_buffer))
        if self._views == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        for i in range(self._n):
            _acquire(objs[i], &self._views[i], f"{what} part {i}")
            self._acquired += 1
            self.parts.push_back(_part(self._views[i].buf, <size_t>self._views[i].len))

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._views != NULL:
            for i in range(self._acquired):
                PyBuffer_Release(&self._views[i])
            PyMem_Free(self._views)
            self._views = NULL


cdef list _wrap_all(vector[shared_ptr[CBuffer]]& bufs):
    cdef list out = []
    cdef size_t i
    for i in range(bufs.size()):
        out.append(Buffer.wrap(bufs[i]))
    return out


cdef class _Core:
    """One joined group member: owns the C++ Communicator. Calls from several threads are
    serialized (the core serves one call at a time)."""
    cdef CCommunicator* _c
    cdef CallLock* _lock  # the engine serves one call at a time: calls from threads queue here
    cdef bint _closed

    def __cinit__(self):
        self._c = NULL
        self._closed = False
        self._lock = new CallLock()

    def __init__(self):
        raise TypeError("use comm.Communicator.join(...)")

    def __dealloc__(self):
        if self._c != NULL:
            with nogil:
                close_quietly(self._c)
                del self._c
            self._c = NULL
        if self._lock != NULL:
            del self._lock
            self._lock = NULL

    cdef CCommunicator* _live(self) except NULL:
        if self._c == NULL or self._closed:
            raise _errors.CommError("this communicator is closed: join a new one")
        return self._c

    @property
    def rank(self):
        return self._live().rank()

    @property
    def size(self):
        return self._live().size()

    @property
    def closed(self):
        return self._closed

    def send(self, obj, int dest, int tag):
        cdef CCommunicator* c = self._live()
        cdef Py_buffer v
        _acquire(obj, &v, "send")
        try:
            with nogil:
                self._lock.lock()
                try:
                    c.send(v.buf, <size_t>v.len, dest, tag)
                finally:
                    self._lock.unlock()
        finally:
            PyBuffer_Release(&v)

    def recv(self, int source, int tag):
        cdef CCommunicator* c = self._live()
        cdef shared_ptr[CBuffer] b
        with nogil:
            self._lock.lock()
            try:
                b = c.recv(source, tag)
            finally:
                self._lock.unlock()
        return Buffer.wrap(b)

    def isend(self, obj, int dest, int tag):
        cdef CCommunicator* c = self._live()
        cdef Request r = Request.__new__(Request)
        _acquire(obj, &r._view, "isend")
        r._has_view = True
        r._owner = self
        r._lock = self._lock
        with nogil:
            self._lock.lock()
            try:
                r._req = c.isend(r._view.buf, <size_t>r._view.len, dest, tag)
            finally:
                self._lock.unlock()
        return r

    def irecv(self, int source, int tag):
        cdef CCommunicator* c = self._live()
        cdef Request r = Request.__new__(Request)
        r._recv = True
        r._owner = self
        r._lock = self._lock
        with nogil:
            self._lock.lock()
            try:
                r._req = c.irecv(source, tag)
            finally:
                self._lock.unlock()
        return r

    def barrier(self):
        cdef CCommunicator* c = self._live()
        with nogil:
            self._lock.lock()
            try:
                c.barrier()
            finally:
                self._lock.unlock()

    def bcast(self, obj, int root):
        """obj is read on root only (None elsewhere)."""
        cdef CCommunicator* c = self._live()
        cdef Py_buffer v
        cdef bint have = obj is not None
        cdef shared_ptr[CBuffer] b
        cdef const void* p = NULL
        cdef size_t n = 0
        if have:
            _acquire(obj, &v, "bcast")
            p = v.buf
            n = <size_t>v.len
        try:
            with nogil:
                self._lock.lock()
                try:
                    b = c.bcast(p, n, root)
                finally:
                    self._lock.unlock()
        finally:
            if have:
                PyBuffer_Release(&v)
        return Buffer.wrap(b)

    def gatherv(self, obj, int root):
        cdef CCommunicator* c = self._live()
        cdef Py_buffer v
        cdef vector[shared_ptr[CBuffer]] bufs
        _acquire(obj, &v, "gatherv")
        try:
            with nogil:
                self._lock.lock()
                try:
                    bufs = c.gatherv(v.buf, <size_t>v.len, root)
                finally:
                    self._lock.unlock()
        finally:
            PyBuffer_Release(&v)
        return _wrap_all(bufs) if c.rank() == root else None

    def scatterv(self, parts, int root):
        """parts (a list, one per rank) is read on root only."""
        cdef CCommunicator* c = self._live()
        cdef _Views views = _Views(list(parts) if parts is not None else [], "scatterv")
        cdef shared_ptr[CBuffer] b
        with nogil:
            self._lock.lock()
            try:
                b = c.scatterv(views.parts, root)
            finally:
                self._lock.unlock()
        return Buffer.wrap(b)

    def allgatherv(self, obj):
        cdef CCommunicator* c = self._live()
        cdef Py_buffer v
        cdef vector[shared_ptr[CBuffer]] bufs
        _acquire(obj, &v, "allgatherv")
        try:
            with nogil:
                self._lock.lock()
                try:
                    bufs = c.allgatherv(v.buf, <size_t>v.len)
                finally:
                    self._lock.unlock()
        finally:
            PyBuffer_Release(&v)
        return _wrap_all(bufs)

    def alltoallv(self, parts):
        cdef CCommunicator* c = self._live()
        cdef _Views views = _Views(list(parts), "alltoallv")
        cdef vector[shared_ptr[CBuffer]] bufs
        with nogil:
            self._lock.lock()
            try:
                bufs = c.alltoallv(views.parts)
            finally:
                self._lock.unlock()
        return _wrap_all(bufs)

    def reduce(self, obj, size_t count, int dtype, int op, int root):
        """Returns the Buffer of the result on root, None elsewhere."""
        cdef CCommunicator* c = self._live()
        cdef Py_buffer v
        cdef shared_ptr[CBuffer] b
        _acquire(obj, &v, "reduce")
        try:
            with nogil:
                self._lock.lock()
                try:
                    b = c.reduce(v.buf, count, <DType>dtype, <ReduceOp>op, root)
                finally:
                    self._lock.unlock()
        finally:
            PyBuffer_Release(&v)
        return Buffer.wrap(b) if b.get() != NULL else None

    def allreduce(self, obj, size_t count, int dtype, int op):
        cdef CCommunicator* c = self._live()
        cdef Py_buffer v
        cdef shared_ptr[CBuffer] b
        _acquire(obj, &v, "allreduce")
        try:
            with nogil:
                self._lock.lock()
                try:
                    b = c.allreduce(v.buf, count, <DType>dtype, <ReduceOp>op)
                finally:
                    self._lock.unlock()
        finally:
            PyBuffer_Release(&v)
        return Buffer.wrap(b)

    def stats(self):
        cdef CCommunicator* c = self._live()
        cdef vector[PeerStats] st
        with nogil:
            self._lock.lock()
            try:
                st = c.stats()
            finally:
                self._lock.unlock()
        out = {}
        for s in st:
            out[s.rank] = {"mode": s.mode.decode(), "address": s.address.decode(),
                           "bytes_sent": s.bytes_sent, "bytes_received": s.bytes_received}
        return out

    def close(self):
        if self._c == NULL or self._closed:
            return
        self._closed = True
        with nogil:
            self._lock.lock()
            try:
                self._c.close()
            finally:
                self._lock.unlock()


def join(str group, str host, int port, str token, int size, int rank, double timeout,
         double punch_timeout, double keepalive, bint allow_direct):
    """Join a group through the rendezvous server; returns a _Core."""
    cdef JoinOptions o
    o.group = group.encode()
    o.rendezvous_host = host.encode()
    o.rendezvous_port = port
    o.token = token.encode()
    o.size = size
    o.rank = rank
    o.timeout_s = timeout
    o.punch_timeout_s = punch_timeout
    o.keepalive_s = keepalive
    o.allow_direct = allow_direct
    cdef CCommunicator* c
    with nogil:
        c = c_join(o)
    cdef _Core core = _Core.__new__(_Core)
    core._c = c
    return core


# ---- stable hashing for comm.join (the same value on every process and machine) ----

cdef inline uint64_t _mix64(uint64_t z) noexcept nogil:
    # splitmix64 finalizer: a bijection with good avalanche
    z = (z ^ (z >> 30)) * <uint64_t>0xbf58476d1ce4e5b9ULL
    z = (z ^ (z >> 27)) * <uint64_t>0x94d049bb133111ebULL
    return z ^ (z >> 31)


def hash_u64(const uint64_t[::1] values, uint64_t[::1] out):
    """out[i] = mix(values[i])."""
    cdef Py_ssize_t i, n = values.shape[0]
    if out.shape[0] != n:
        raise ValueError("hash_u64: out must have the length of values")
    with nogil:
        for i in range(n):
            out[i] = _mix64(values[i])


def hash_binary(const int64_t[::1] offsets, const uint8_t[::1] data, uint64_t[::1] out):
    """out[i] = hash of data[offsets[i]:offsets[i+1]] (FNV-1a 64, then mixed)."""
    cdef Py_ssize_t i, n = out.shape[0]
    cdef int64_t j, a, b
    cdef uint64_t h
    if offsets.shape[0] != n + 1:
        raise ValueError("hash_binary: offsets must have one more entry than out")
    if n and (offsets[0] < 0 or offsets[n] > data.shape[0]):
        raise ValueError("hash_binary: offsets point outside data")
    with nogil:
        for i in range(n):
            a = offsets[i]
            b = offsets[i + 1]
            h = <uint64_t>0xcbf29ce484222325ULL
            for j in range(a, b):
                h = (h ^ data[j]) * <uint64_t>0x100000001b3ULL
            out[i] = _mix64(h ^ <uint64_t>(b - a))
    return None


def combine_hashes(uint64_t[::1] acc, const uint64_t[::1] h):
    """acc[i] = mix(acc[i] * 31 + h[i]): order-sensitive combination of key columns."""
    cdef Py_ssize_t i, n = acc.shape[0]
    if h.shape[0] != n:
        raise ValueError("combine_hashes: arrays must have the same length")
    with nogil:
        for i in range(n):
            acc[i] = _mix64(acc[i] * <uint64_t>31 + h[i])
