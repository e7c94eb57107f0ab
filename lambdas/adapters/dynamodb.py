"""DynamoDB: the durable registry (functions, endpoints), one record per submission,
and the durable task history written in bulk off the hot path (boto3).

Tables (prefix from SKYFN_TABLE_PREFIX):
  <p>-functions    pk function_id
  <p>-endpoints    pk endpoint_id; name claims 'name#<owner>#<name>' -> endpoint_id make
                   re-registering a name safe; GSI owner-index (owner) lists an owner's
  <p>-submissions  pk submission_id
  <p>-history      pk k, sk s: the finished tasks, filed in compressed pages per owner
                   (lambdas/adapters/history_pages.py)
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import boto3
from boto3.dynamodb.conditions import Key
from botocore.config import Config
from botocore.exceptions import ClientError

from lambdas.adapters.history_pages import TaskHistory

_BOTO_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=5, read_timeout=30)


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    """DynamoDB gives numbers as Decimal; the service speaks float/int."""
    out = {}
    for k, v in item.items():
        if isinstance(v, Decimal):
            out[k] = int(v) if v == v.to_integral_value() else float(v)
        else:
            out[k] = v
    return out


def _dynamo(item: dict[str, Any]) -> dict[str, Any]:
    return {k: (Decimal(str(v)) if isinstance(v, float) else v) for k, v in item.items() if v is not None}


class Dynamo:
    def __init__(self, prefix: str, resource: Any = None):
        self.prefix = prefix
        self.db = resource or boto3.resource("dynamodb", config=_BOTO_CONFIG)
        self.functions = self.db.Table(f"{prefix}-functions")
        self.endpoints = self.db.Table(f"{prefix}-endpoints")
        self.submissions = self.db.Table(f"{prefix}-submissions")
        self.history_table = self.db.Table(f"{prefix}-history")
        self.history = TaskHistory(self.history_table)

    # --- schema ------------------------------------------------------------------
    def ensure_tables(self) -> None:
        client = self.db.meta.client
        existing = set(client.list_tables().get("TableNames", []))
        specs = {  # name -> (partition key, sort key, GSI owner-index)
            self.functions.name: ("function_id", None, None),
            self.endpoints.name: ("endpoint_id", None, ("owner", None)),
            self.submissions.name: ("submission_id", None, None),
            self.history_table.name: ("k", "s", None),
        }
        for name, (pk, sk, gsi) in specs.items():
            if name in existing:
                continue
            attrs = [{"AttributeName": pk, "AttributeType": "S"}]
            schema = [{"AttributeName": pk, "KeyType": "HASH"}]
            if sk:
                attrs.append({"AttributeName": sk, "AttributeType": "S"})
                schema.append({"AttributeName": sk, "KeyType": "RANGE"})
            kwargs: dict[str, Any] = {}
            if gsi:
                hash_key, range_key = gsi
                attrs.append({"AttributeName": hash_key, "AttributeType": "S"})
                index = [{"AttributeName": hash_key, "KeyType": "HASH"}]
                if range_key:
                    attrs.append({"AttributeName": range_key, "AttributeType": "N"})
                    index.append({"AttributeName": range_key, "KeyType": "RANGE"})
                kwargs["GlobalSecondaryIndexes"] = [
                    {"IndexName": "owner-index", "KeySchema": index, "Projection": {"ProjectionType": "ALL"}}
                ]
            try:
                client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", AttributeDefinitions=attrs,
                                    KeySchema=schema, **kwargs)
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ResourceInUseException":
                    raise
        for name in specs:
            client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})

    # --- functions ---------------------------------------------------------------
    def put_function(self, item: dict[str, Any]) -> None:
        self.functions.put_item(Item=_dynamo(item))

    def get_function(self, function_id: str) -> dict[str, Any] | None:
        item = self.functions.get_item(Key={"function_id": function_id}).get("Item")
        return _plain(item) if item else None

    # --- endpoints ---------------------------------------------------------------
    def claim_endpoint_name(self, owner: str, name: str, endpoint_id: str) -> str:
        """Atomically bind owner/name to endpoint_id; returns the id that holds the name."""
        key = f"name#{owner}#{name}"
        try:
            self.endpoints.put_item(Item={"endpoint_id": key, "target": endpoint_id},
                                    ConditionExpression="attribute_not_exists(endpoint_id)")
            return endpoint_id
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
        item = self.endpoints.get_item(Key={"endpoint_id": key}, ConsistentRead=True)["Item"]
        return item["target"]

    def put_endpoint(self, item: dict[str, Any]) -> None:
        self.endpoints.put_item(Item=_dynamo(item))

    def get_endpoint(self, endpoint_id: str) -> dict[str, Any] | None:
        if endpoint_id.startswith("name#"):
            return None
        item = self.endpoints.get_item(Key={"endpoint_id": endpoint_id}).get("Item")
        return _plain(item) if item and "owner" in item else None

    # --- endpoint groups: items 'group#<id>' of the endpoints table. Their owner is kept
    # as 'group_owner', so the owner-index (endpoint listing) never sees them.
    def put_group(self, item: dict[str, Any]) -> None:
        self.endpoints.put_item(Item=_dynamo({**item, "endpoint_id": f"group#{item['group_id']}"}))

    def get_group(self, group_id: str) -> dict[str, Any] | None:
        item = self.endpoints.get_item(Key={"endpoint_id": f"group#{group_id}"}).get("Item")
        return _plain(item) if item and "group_owner" in item else None

    def list_endpoints(self, owner: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"IndexName": "owner-index", "KeyConditionExpression": Key("owner").eq(owner)}
        while True:
            page = self.endpoints.query(**kwargs)
            items.extend(_plain(i) for i in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    # --- submissions and history (bulk, off the hot path) ------------------------
    def write_bulk(self, submissions: list[dict[str, Any]], tasks: list[dict[str, Any]],
                   expires_at: int | None = None) -> int:
        """Submission records one item each, finished tasks in history pages. Returns the
        pages written."""
        with self.submissions.batch_writer(overwrite_by_pkeys=["submission_id"]) as batch:
            for item in submissions:
                batch.put_item(Item=_dynamo(item | ({"expires_at": expires_at} if expires_at else {})))
        return self.history.write(tasks, expires_at) if tasks else 0

    def tasks_since(self, owner: str, since: float, limit: int) -> list[dict[str, Any]]:
        """The owner's finished tasks created at or after `since`, newest first."""
        return self.history.since(owner, since, limit)

    def get_task(self, owner: str, task_id: str) -> dict[str, Any] | None:
        """One of the owner's finished tasks (None if not archived, or another owner's)."""
        return self.history.get(owner, task_id)

    def get_tasks(self, owner: str, task_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The owner's finished tasks among `task_ids`, by id."""
        return self.history.get_many(owner, task_ids)

    def get_some_tasks(self, owner: str, task_ids: list[str], max_pages: int) -> tuple[dict[str, dict[str, Any]],
                                                                                      list[str]]:
        """The owner's finished tasks among `task_ids`, by id, reading at most `max_pages` of
        the history's page groups (a second of task ids each, oldest first); and the ids whose
        pages were left unread (ask again for them)."""
        return self.history.get_some(owner, task_ids, max_pages)

    def get_submission(self, submission_id: str) -> dict[str, Any] | None:
        item = self.submissions.get_item(Key={"submission_id": submission_id}).get("Item")
        return _plain(item) if item else None
