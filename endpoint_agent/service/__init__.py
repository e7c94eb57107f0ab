"""The agent's link to the service: registration and heartbeats (link.py), the endpoint's
own credential (credential.py), the long-poll of the task and control queues (poller.py),
results and acks sent off the interchange's loop (outbox.py), and results too large to
travel inline put in the service's blob store (blob_results.py). Nothing is imported
here: import the modules themselves.
"""
