"""The REST API's limits, as plain constants: the SDK reads them without importing the
request models of skyfn.protocol.api (pydantic), which keeps `import skyfn` quick."""

MAX_BATCH = 20_000          # tasks in one POST /tasks
MAX_STATUS_IDS = 20_000     # ids in one POST /tasks/status
MAX_WAIT_SECONDS = 20.0     # long-poll ceiling, under API Gateway's 29 s
MAX_PAYLOAD_BYTES = 1 << 20  # one task's argument buffer inline
MAX_FUNCTION_BYTES = 256 << 10
MAX_REQUEST_BYTES = 10 << 20  # API Gateway's payload limit
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
# One task's result (or error) buffer inline in a ResultPack: the service fails the task
# with this cap in the reason above it (larger results travel through S3, skyfn.protocol.blobs).
MAX_INLINE_RESULT_BYTES = 1 << 20
