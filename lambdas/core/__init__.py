"""The service core shared by the handlers: registry, task submission and status."""
