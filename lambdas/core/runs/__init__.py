"""Runs: the Step Functions executions the service starts for a user, and what their steps do.

A *run* is one execution of a batch (a large fan-out as a Distributed Map: batches), a flow
(a user's state machine of steps, compiled from skyfn.flows: flows) or an SPMD group (flows,
steps), recorded under its owner (runs); the Task states of every run call the handlers of
lambdas/sfn_steps, whose logic is steps and batches here. settings holds the deployed state
machines' names, ARNs and the rendezvous server; rendezvous_tokens issues rendezvous group
tokens to users; actions runs a task as a step of a Globus Flows flow (the Action Provider).
Builds on lambdas.core.tasks and lambdas.core.identity.
"""
