"""IAM enforced in the embedded runtime (issue 25): the roles of the synthesized CDK
template created in moto, each handler running with its own role's session credentials,
and moto's IAM enforcement made faithful enough that a call the template does not allow
fails here as it would on AWS.

- policy: AWS's policy evaluation (Action/NotAction, Resource/NotResource, Condition,
  trust-policy principals), pure and independent of moto.
- moto_resources: runs inside the moto server (installed by infra.local.standins.sfn.moto_bridge
  when SKYFN_MOTO_IAM_RESOURCES=1): the request resources of the services skyfn uses,
  evaluation of every request with `policy` (identity policies intersected with the
  session policy of AssumeRole), presigned S3 URLs, an access log, and service-assumed
  credentials for Lambda functions and state machines.
- roles: provisioning through the moto API: the deployer user, the roles and their
  policies, switching enforcement on, a function's session credentials.
- report: least privilege from the access log: per function, allowed vs used actions.
"""
