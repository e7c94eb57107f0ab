"""Amazon States Language definitions and their renderer (DESIGN.md section 1).

catalog.py lists every state machine with its ASL file and the Lambda step handlers it
invokes (lambdas/workflows/); render.py fills the placeholders; local_deploy.py creates
the functions and state machines in moto (or any AWS endpoint) for the embedded runtime;
moto_bridge.py is the moto server entry point whose Lambda invocations run our handlers.
"""
