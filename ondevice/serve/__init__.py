"""`ondevice serve`: an OpenAI-compatible HTTP server over one loaded pipeline.

The request's path through the package: app.py (routes, API key, body limit) → schemas.py (the
request, checked) → queue.py (FIFO, one generation at a time in a worker thread) → generation.py
(the pipeline's records, stop sequences, cancellation) → responses.py (OpenAI's JSON and
server-sent events). errors.py gives every failure OpenAI's error shape.
"""
