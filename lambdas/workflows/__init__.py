"""The Lambda step handlers of the Step Functions workflows (stepfunctions/catalog.py):
route_chunk and batch_progress (batch fan-out), run_task (flows, SPMD ranks) and
spmd_init. Each module is one handler; the logic lives in lambdas.core.batches/runs."""
