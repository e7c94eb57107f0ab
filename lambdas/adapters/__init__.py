"""Adapters from the service core to AWS services (DynamoDB) and Redis. The task-queue
adapters (Redis Streams, SQS) are shared with endpoint agents: skyfn.protocol.queues."""
