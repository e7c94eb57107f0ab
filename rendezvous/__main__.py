"""`python -m rendezvous`: run the rendezvous server (see rendezvous/cli.py)."""
import sys

from .cli import main

sys.exit(main())
