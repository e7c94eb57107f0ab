"""Step Functions in the embedded runtime: the state machines of stepfunctions/catalog.py
deployed into moto, whose Lambda Task states run skyfn's real step handlers.

  moto_bridge   the moto server entry point (`python -m infra.local.standins.sfn.moto_bridge`) whose
                Lambda invocations of our step functions run their handlers
  deploy        creates the bucket, role, step functions and state machines without CDK
  service_env   what the service process calls at start: deploy, then export the API's
                settings into its environment
"""
