"""The rendezvous server (DESIGN.md section 7): pairs peers for hole punching, assigns
ranks, bootstraps groups.

Not built yet: this package only reserves its place in the layout. Nothing imports it.
"""
