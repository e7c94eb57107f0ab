"""The stacks of the CDK app, one module each: network, data, service, workflows,
rendezvous, agent access."""
