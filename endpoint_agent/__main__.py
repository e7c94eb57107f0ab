"""`python -m endpoint_agent` is the `skyfn-endpoint` command."""
from endpoint_agent.cli import main

if __name__ == "__main__":
    main()
