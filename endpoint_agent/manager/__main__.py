"""`python -m endpoint_agent.manager` runs a manager (manager.py; the command line is in
endpoint_agent/wire.py)."""
import sys

from endpoint_agent.manager.manager import main

if __name__ == "__main__":
    sys.exit(main())
