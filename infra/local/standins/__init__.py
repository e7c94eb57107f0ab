"""The local stand-ins of the cloud services the embedded runtime runs the service on, each
shaped as its AWS (or Globus) counterpart behaves so the handlers of lambdas/ run unchanged:

- gateway.py: API Gateway's REST API (an HTTP server invoking the API handler); push_hub.py
  its WebSocket API;
- lambda_pool.py, lambda_worker.py, lambda_forkserver.py: Lambda's execution environments;
- event_source.py: the SQS event-source mapping of the results function; scheduler.py:
  EventBridge schedules; events.py: the event and context shapes Lambda hands its handlers;
- iam/: IAM enforced in moto; sfn/: Step Functions in moto (state machines, their steps);
- globus_transfer/: the Globus Transfer API.

The runtime's own life (starting, stopping, recovering, saving moto's state, the processes
and files) is the package above, infra/local.
"""
