"""A local stand-in of the Globus Transfer API: the subset globus-sdk's TransferClient calls
for staging, serving real copies between local directories that act as collections.

    python -m infra.local.standins.globus_transfer --collection 6f1c...=/data/a --collection 0b3e...=/data/b \\
        --token my-token [--port 8600] [--client ID=SECRET] [--log transfers.json]

then point globus-sdk at it (its documented settings; the client path is the real one):

    export GLOBUS_SDK_SERVICE_URL_TRANSFER=http://127.0.0.1:8600/
    export GLOBUS_SDK_SERVICE_URL_AUTH=http://127.0.0.1:8600/     # token refresh, client credentials
    tc = globus_sdk.TransferClient(authorizer=globus_sdk.AccessTokenAuthorizer("my-token"))

Served (version prefix /v0.10/, as globus-sdk 4.x calls it):
  GET  /submission_id                      a fresh submission id
  POST /transfer                           submit a Transfer task (TransferData); a repeated
                                           submission id answers "Duplicate" with the first task
  POST /delete                             submit a Delete task (DeleteData)
  GET  /task/<id>                          the task document: status ACTIVE | SUCCEEDED | FAILED,
                                           nice_status, fatal_error {code, description}, counts
  GET  /task_list?filter=task_id:a,b       many tasks in one call (offset/limit paging)
  GET  /task/<id>/successful_transfers     paged by marker
  GET  /task/<id>/skipped_errors           source errors skipped under skip_source_errors
  POST /task/<id>/cancel                   "Canceled", or "TaskComplete" when it has ended
  GET  /operation/endpoint/<id>/ls?path=   a directory listing
and, for globus-sdk's auth clients, POST /v2/oauth2/token (grant_type refresh_token,
client_credentials, or authorization_code for codes given with --auth-code) issuing access
tokens this server then accepts.

Tasks run asynchronously, one thread each, copying item by item (to a temporary name,
then renamed into place; parent directories are created, as Globus does). A missing
source path fails the task with Globus's fatal error FILE_NOT_FOUND "No such file or
directory" -- or, with skip_source_errors, skips the item and lists it under
skipped_errors. `log` (also GET /standin/log) records every task submitted: its type,
collections, item count, status, and the most tasks ever ACTIVE at once.

Modules: model (the task record, the task log, the API's constants and errors), engine
(the copy engine: runs a task's items in its own thread), server (TransferStandIn: the
API's operations over the collections and tokens, and its HTTP server's life), routes (the
HTTP routes onto those operations), __main__ (the command line above).
"""
