"""Direct sessions, the agent's side: the CurveZMQ socket SDKs send task packs to
(`DirectServer`, server.py) and the receipt the interchange keeps for such a pack
(`DirectReceipt`, receipt.py). The interchange owns the server and imports this package;
this package imports nothing of the interchange. Nothing is imported here: the
interchange loads the server only when `direct:` is configured.
"""
