"""The communicator (DESIGN.md section 7): C++17 core with Cython bindings for direct,
NAT-punched TCP channels and MPI-like collectives between functions.

Not built yet: this package only reserves its place in the layout. Nothing imports it.
"""
