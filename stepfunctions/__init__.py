"""Amazon States Language definitions and their renderer (DESIGN.md section 1).

Not built yet: this package only reserves its place in the layout. Nothing imports it.
"""
