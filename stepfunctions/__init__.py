"""Amazon States Language definitions and their renderer (DESIGN.md section 1).

catalog.py lists every state machine with its ASL file and the Lambda step handlers it
invokes (lambdas/sfn_steps/); render.py fills the placeholders. The package imports
nothing of lambdas, infra or endpoint_agent: the embedded runtime's deployment of these
machines into moto lives in infra/local/standins/sfn/, the CDK app's in infra/aws/stacks/workflows.py.
"""
