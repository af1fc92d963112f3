"""HTTP/1.1 on asyncio protocols and httptools: the server both the gateway and the worker run,
and the pooled keep-alive client the gateway and the load generator send with (design 0007).
"""
