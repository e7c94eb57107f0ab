// Glue between the C++ core and the Cython binding (comm/_core.pyx): C++ exceptions
// become the Python exceptions of comm.errors, and two helpers Cython cannot express
// (taking ownership of a unique_ptr, waiting on a request without ever throwing).
#pragma once

#include <Python.h>

#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>

#include "skyfn_comm/communicator.hpp"

namespace skyfn_glue {

// Python exception classes, set once at import by _core.pyx (strong references).
inline PyObject* exc_comm = nullptr;
inline PyObject* exc_auth = nullptr;
inline PyObject* exc_timeout = nullptr;
inline PyObject* exc_lost = nullptr;

inline void set_exception_types(PyObject* comm, PyObject* auth, PyObject* timeout,
                                PyObject* lost) {
  Py_XINCREF(comm);
  Py_XINCREF(auth);
  Py_XINCREF(timeout);
  Py_XINCREF(lost);
  exc_comm = comm;
  exc_auth = auth;
  exc_timeout = timeout;
  exc_lost = lost;
}

// Called by Cython inside its catch(...) block (with the GIL held): rethrow and map.
inline void translate_exception() {
  try {
    throw;
  } catch (const skyfn::comm::AuthError& e) {
    PyErr_SetString(exc_auth, e.what());
  } catch (const skyfn::comm::TimeoutError& e) {
    PyErr_SetString(exc_timeout, e.what());
  } catch (const skyfn::comm::PeerLostError& e) {
    PyErr_SetString(exc_lost, e.what());
  } catch (const skyfn::comm::CommError& e) {
    PyErr_SetString(exc_comm, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::out_of_range& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(exc_comm, e.what());
  } catch (...) {
    PyErr_SetString(exc_comm, "unknown C++ exception in the communicator core");
  }
}

// The engine serves one user thread at a time (engine.hpp); the binding releases the GIL,
// so calls from several Python threads on one communicator queue on this lock. Recursive:
// while a thread holds it, turning a C++ error into a Python exception can run the garbage
// collector, whose dropped isend requests lock again (to wait for their sends) on the
// same thread, after the failed call has already left the engine.
struct CallLock {
  std::recursive_mutex mu;
  void lock() { mu.lock(); }
  void unlock() { mu.unlock(); }
};

inline skyfn::comm::Communicator* join(const skyfn::comm::JoinOptions& opts) {
  return skyfn::comm::Communicator::join(opts).release();
}

// For destructors: a dropped isend must finish before its buffer is released.
inline void wait_quietly(const std::shared_ptr<skyfn::comm::Request>& r) noexcept {
  try {
    if (r) r->wait();
  } catch (...) {
  }
}

inline void close_quietly(skyfn::comm::Communicator* c) noexcept {
  try {
    if (c) c->close();
  } catch (...) {
  }
}

}  // namespace skyfn_glue
