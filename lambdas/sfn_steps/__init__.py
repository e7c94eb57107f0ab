"""The Lambda handlers that Step Functions Task states invoke (stepfunctions/catalog.py STEPS):
route_chunk and batch_progress (batch fan-out), run_task (flows, SPMD ranks) and spmd_init.
Each module is one handler; the logic lives in lambdas.core.runs (batches, steps)."""
